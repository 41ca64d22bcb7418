//! The scale-down-delay window: the largest value recorded over the last `delay`, in 2-second
//! slots (Knative's `aggregation/max.TimeWindow`, docs/architecture.md, "Knative's rules").
//!
//! A monotone deque: each entry is larger than every later one, so the front is the maximum.
//! Entries have distinct, increasing slots within the window, so the deque never holds more
//! than `slots` entries.
//!
//! Unlike Knative, whose window is sized once when the decider is created, [`SlidingMax::resize`]
//! lets a live change of `scale-down-delay` take effect: the history is kept and entries older
//! than the new length fall out at the next record.

use std::collections::VecDeque;
use std::time::Duration;

/// Slot width: one decider tick.
pub const SLOT_SECONDS: u64 = 2;

/// The maximum of the values recorded in the last `slots` slots.
#[derive(Debug, Clone)]
pub struct SlidingMax {
    /// (slot, value), values strictly decreasing from front to back.
    entries: VecDeque<(u64, u32)>,
    /// Window length in slots (ceil(delay / 2s), at least 1).
    slots: u64,
}

/// ceil(delay / 2s), at least 1.
fn slots_for(delay: Duration) -> u64 {
    let secs = delay.as_secs() + u64::from(delay.subsec_nanos() > 0);
    secs.div_ceil(SLOT_SECONDS).max(1)
}

impl SlidingMax {
    /// An empty window covering `delay`.
    pub fn new(delay: Duration) -> Self {
        let slots = slots_for(delay);
        Self {
            entries: VecDeque::with_capacity(usize::try_from(slots.min(4096)).unwrap_or(4096)),
            slots,
        }
    }

    /// Changes the window to cover `delay`, keeping the recorded history.
    pub fn resize(&mut self, delay: Duration) {
        self.slots = slots_for(delay);
    }

    /// Records `value` at `second` (of [`crate::clock`]). Two values in one slot keep the
    /// larger. Seconds must not go backwards by more than a slot; an older value is folded into
    /// the newest slot rather than rewriting history.
    pub fn record(&mut self, second: u64, value: u32) {
        let slot = (second / SLOT_SECONDS).max(self.entries.back().map_or(0, |e| e.0));
        // Anything not larger than the new value can never be the maximum again.
        let mut value = value;
        while let Some(&(s, v)) = self.entries.back() {
            if value < v {
                break;
            }
            if s == slot {
                value = value.max(v);
            }
            self.entries.pop_back();
        }
        // Drop entries that have left the window.
        while let Some(&(s, _)) = self.entries.front() {
            if slot - s >= self.slots {
                self.entries.pop_front();
            } else {
                break;
            }
        }
        match self.entries.back_mut() {
            // The same slot holds a larger value already: keep it.
            Some((s, v)) if *s == slot => *v = (*v).max(value),
            _ => self.entries.push_back((slot, value)),
        }
    }

    /// The maximum over the window as of the last record (0 before any).
    pub fn current(&self) -> u32 {
        self.entries.front().map_or(0, |e| e.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_the_maximum_for_the_delay() {
        // 10s = 5 slots of 2s.
        let mut w = SlidingMax::new(Duration::from_secs(10));
        w.record(0, 5);
        assert_eq!(w.current(), 5);
        for s in [2, 4, 6, 8] {
            w.record(s, 1);
            assert_eq!(w.current(), 5, "second {s}");
        }
        w.record(10, 1);
        assert_eq!(w.current(), 1, "slot 0 has left the window");
    }

    #[test]
    fn a_larger_value_takes_over_at_once() {
        let mut w = SlidingMax::new(Duration::from_secs(10));
        w.record(0, 2);
        w.record(2, 7);
        assert_eq!(w.current(), 7);
        w.record(4, 3);
        w.record(6, 4);
        assert_eq!(w.current(), 7);
        w.record(12, 1);
        assert_eq!(
            w.current(),
            4,
            "7 (slot 1) left, 4 (slot 3) is the max of slots 2..=6"
        );
        assert!(w.entries.len() <= w.slots as usize);
    }

    #[test]
    fn one_slot_keeps_the_larger_of_two_values() {
        let mut w = SlidingMax::new(Duration::from_secs(4));
        w.record(10, 6);
        w.record(11, 2);
        assert_eq!(w.current(), 6);
        w.record(12, 1);
        w.record(13, 3);
        assert_eq!(w.current(), 6);
        w.record(14, 0);
        assert_eq!(w.current(), 3);
    }

    #[test]
    fn resizing_applies_to_the_kept_history() {
        let mut w = SlidingMax::new(Duration::from_secs(20));
        w.record(0, 9);
        w.record(2, 1);
        w.record(4, 1);
        assert_eq!(w.current(), 9);
        // Shrink to 4s (2 slots): slot 0 is now too old.
        w.resize(Duration::from_secs(4));
        w.record(6, 1);
        assert_eq!(w.current(), 1);
        // Grow again: what was dropped stays dropped, new values are held longer.
        w.resize(Duration::from_secs(20));
        w.record(8, 4);
        w.record(24, 0);
        assert_eq!(w.current(), 4);
        w.record(28, 0);
        assert_eq!(w.current(), 0);
    }
}
