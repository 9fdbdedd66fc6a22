//! What one commit wrote for each source table, for the commit's log
//! line.

use std::collections::HashMap;
use std::fmt;

use crate::lake::catalog::row_delta::Written;

/// What one commit wrote for a source table, both its tables together.
#[derive(Debug, Default)]
pub(super) struct Tally {
    pub(super) ops: HashMap<&'static str, u64>,
    pub(super) written: Written,
}

impl fmt::Display for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = |code| self.ops.get(code).copied().unwrap_or(0);
        write!(
            f,
            "inserts {}, updates {}, deletes {}, rows {}, files {}, bytes {}",
            op("c"),
            op("u"),
            op("d"),
            self.ops.values().sum::<u64>(),
            self.written.files,
            self.written.bytes
        )
    }
}
