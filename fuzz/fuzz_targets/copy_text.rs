//! COPY text rows and the text decoders of every type on arbitrary input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wal2iceberg::cdc::value::PgType;
use wal2iceberg::pg::copy::split_fields;

const TYPES: &[u32] = &[
    16, 17, 20, 21, 23, 25, 114, 650, 700, 701, 869, 1082, 1083, 1114, 1184, 1186, 1266, 1700,
    2950, 3802, 1007, 1009, 1231, 1185, 1187,
];

fuzz_target!(|data: &[u8]| {
    if let Ok(fields) = split_fields(data, 3) {
        for field in fields.into_iter().flatten() {
            for &oid in TYPES {
                let _ = PgType::builtin(oid).expect("built-in").parse(&field);
            }
        }
    }
});
