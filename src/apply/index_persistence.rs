//! What outlives a connection: each silver table's key index, persisted
//! in its state folder when the stream ends, cleanly or not, for the next
//! connection or start to restore instead of reading every key.

use super::pipeline::Pipeline;

impl Pipeline<'_> {
    /// Persists each silver table's key index that holds exactly its last
    /// commit (nothing staged), for the next connection or start: call
    /// once the stream ended and the batch was committed or abandoned. A
    /// failure is a warning: the next start rebuilds that index.
    pub(crate) fn persist_indexes(&mut self) {
        for (table, sink) in &mut self.sinks {
            let Some(silver) = sink.silver.as_mut() else {
                continue;
            };
            match silver.persist_index() {
                Ok(true) => tracing::debug!(table = %table, "silver key index persisted"),
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(table = %table, error = %e, "cannot persist the silver key index; the next start rebuilds it")
                }
            }
        }
    }

    /// Drops the open batch after the stream failed mid-way: nothing of
    /// it is committed, and the slot streams it again. Each silver's key
    /// index is taken back to its last commit
    /// (`crate::lake::table::silver::SilverTable::abandon`) and persisted.
    pub(crate) fn abandon(&mut self) {
        for (table, sink) in &mut self.sinks {
            let Some(silver) = sink.silver.as_mut() else {
                continue;
            };
            let staged = silver.is_staged();
            match silver.abandon() {
                Ok(true) if staged => {
                    tracing::info!(table = %table, "the open batch was taken out of silver's key index")
                }
                Ok(true) => {}
                Ok(false) => {
                    tracing::info!(table = %table, "the open batch cannot be taken out of silver's key index: the next connection rebuilds it")
                }
                Err(e) => {
                    tracing::warn!(table = %table, error = %e, "cannot take the open batch out of silver's key index: the next connection rebuilds it")
                }
            }
        }
        self.persist_indexes();
    }
}
