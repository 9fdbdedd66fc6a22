//! The assembler on valid pgoutput sessions the input chooses (ordinary and
//! streamed transactions interleaved, subtransaction and transaction
//! aborts, relations redefined; src/cdc/assembler/script.rs): it must not
//! panic and must emit exactly the events the model expects.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wal2iceberg::cdc::assembler::script;

fuzz_target!(|data: &[u8]| {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime");
    runtime.block_on(script::check(data));
});
