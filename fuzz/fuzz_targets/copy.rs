//! Binary COPY streams, and the decoders of every built-in type's binary
//! format and text output, on arbitrary input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wal2iceberg::cdc::value::{PgType, Wire};
use wal2iceberg::pg::copy::BinaryCopyReader;

const TYPES: &[u32] = &[
    16, 17, 18, 19, 20, 21, 23, 25, 114, 650, 700, 701, 869, 1042, 1043, 1082, 1083, 1114, 1184,
    1186, 1266, 1700, 2950, 3802, 1007, 1009, 1231, 1185, 1187,
];

fn decode_as_every_type(bytes: &[u8]) {
    for &oid in TYPES {
        let pg_type = PgType::builtin(oid).expect("built-in");
        let _ = Wire::of(oid).0.decode(&pg_type, bytes);
        let _ = Wire::Text.decode(&pg_type, bytes);
    }
}

fuzz_target!(|data: &[u8]| {
    let mut reader = BinaryCopyReader::new(3);
    if reader.push(data).is_ok() {
        let _ = reader.finish();
        let _ = reader.take().for_each::<()>(|fields| {
            fields.flatten().for_each(decode_as_every_type);
            Ok(())
        });
    }
    decode_as_every_type(data);
});
