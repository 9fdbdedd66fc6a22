//! The two tables per source table: `bronze`, one row per change, and
//! `silver`, the current state, with its index of live keys (`key`,
//! `key_index`, spilling to `sorted_run` files) and `gap`, which fills the
//! unchanged TOAST values of changes bronze takes alone.

pub mod bronze;
pub(crate) mod gap;
pub mod key;
pub mod key_index;
pub mod silver;
pub(crate) mod sorted_run;
