//! The words every layer shares: a position in the write-ahead log, a
//! source table's name and a replication slot's state. They sit on the ground floor, below the wire
//! (`pg`), the domain (`cdc`) and the lake, so that none of those has to
//! reach into another for them.

mod lsn;
mod slot;
mod table_name;

pub use lsn::{Lsn, ParseLsnError};
pub(crate) use slot::SlotHealth;
pub use slot::SlotInfo;
pub use table_name::TableName;
