//! The words every layer shares: a position in the write-ahead log and a
//! source table's name. They sit on the ground floor, below the wire
//! (`pg`), the domain (`cdc`) and the lake, so that none of those has to
//! reach into another for them.

mod lsn;
mod table_name;

pub use lsn::{Lsn, ParseLsnError};
pub use table_name::TableName;
