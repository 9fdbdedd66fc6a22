//! The lake's files: typed values as Arrow arrays (`arrow`), Parquet data
//! files and a snapshot's source position (`writer`), position delete
//! files as streams of pairs (`position_deletes`), and reading a table's
//! files back (`scan`), each in the table's current schema (`align`).

pub(crate) mod align;
pub mod arrow;
pub mod position_deletes;
pub(crate) mod scan;
pub mod writer;
