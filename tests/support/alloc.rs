//! Counts the bytes the current thread holds, so a test on a
//! current-thread runtime can bound the memory its stream processing uses
//! without noise from tests running on other threads.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

pub struct ThreadCounting;

thread_local! {
    static HELD: Cell<i64> = const { Cell::new(0) };
    static PEAK: Cell<i64> = const { Cell::new(0) };
}

fn track(delta: i64) {
    let _ = HELD.try_with(|held| {
        let now = held.get() + delta;
        held.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

unsafe impl GlobalAlloc for ThreadCounting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        track(layout.size() as i64);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        track(-(layout.size() as i64));
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        track(new_size as i64 - layout.size() as i64);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Starts measuring: the peak so far is reset to what is held now.
pub fn reset_peak() -> i64 {
    let now = HELD.with(Cell::get);
    PEAK.with(|p| p.set(now));
    now
}

/// The most this thread held since [`reset_peak`].
pub fn peak() -> i64 {
    PEAK.with(Cell::get)
}
