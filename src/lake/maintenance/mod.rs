//! Keeping tables readable and small: `compaction` (the policy, and
//! bronze's; silver's is in `table::silver`) and `expire` (snapshot
//! expiry, and the orphan sweep of files no snapshot reads).

pub mod compaction;
pub mod expire;
