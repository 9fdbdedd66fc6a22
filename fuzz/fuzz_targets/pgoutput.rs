//! The replication framing and the pgoutput decoder, in and out of stream
//! blocks, on arbitrary bytes: errors are fine, panics are bugs.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use wal2iceberg::pg::pgoutput::Decoder;
use wal2iceberg::pg::replication::ReplicationMessage;

fuzz_target!(|data: &[u8]| {
    let bytes = Bytes::copy_from_slice(data);
    let _ = ReplicationMessage::decode(bytes.clone());
    let _ = Decoder::new().decode(bytes.clone());
    let _ = Decoder::streamed().decode(bytes);
});
