//! Runs merged into one, the newest entry of a key winning, and which
//! runs' filters fit the memory left.

use std::io::{self};

use crate::lake::table::key::Key;
use crate::lake::table::sorted_run::{Run, Slot};

/// Whether each filter of these sizes, the newest run's first, fits in
/// `budget` beside the newer ones kept.
pub(super) fn fitting(
    budget: usize,
    sizes: impl Iterator<Item = usize>,
) -> impl Iterator<Item = bool> {
    let mut left = budget;
    sizes.map(move |size| {
        left.checked_sub(size)
            .inspect(|rest| left = *rest)
            .is_some()
    })
}

/// One layer's entries, in key order.
pub(super) type Layer<'a> = Box<dyn Iterator<Item = io::Result<(Key, Slot)>> + 'a>;

/// Merges `runs` (oldest first) and then `newest`, each in key order, into
/// one sequence in key order where a key appears once, as its newest
/// layer says.
pub(super) fn merge<'a>(
    runs: impl IntoIterator<Item = &'a Run>,
    newest: Vec<(Key, Slot)>,
) -> impl Iterator<Item = io::Result<(Key, Slot)>> + 'a {
    let mut layers: Vec<Layer<'a>> = runs
        .into_iter()
        .map(|r| Box::new(r.iter()) as Layer)
        .collect();
    layers.push(Box::new(newest.into_iter().map(Ok)));
    let mut heads: Vec<Option<(Key, Slot)>> = vec![None; layers.len()];
    let mut started = false;
    std::iter::from_fn(move || {
        if !started {
            started = true;
            for (head, layer) in heads.iter_mut().zip(&mut layers) {
                match layer.next().transpose() {
                    Ok(next) => *head = next,
                    Err(e) => return Some(Err(e)),
                }
            }
        }
        let smallest = heads.iter().flatten().map(|(k, _)| k).min()?.clone();
        let mut winner = None;
        for (head, layer) in heads.iter_mut().zip(&mut layers) {
            if head.as_ref().is_some_and(|(k, _)| *k == smallest) {
                winner = head.take();
                match layer.next().transpose() {
                    Ok(next) => *head = next,
                    Err(e) => return Some(Err(e)),
                }
            }
        }
        winner.map(Ok)
    })
}
