//! A metric value spread over per-thread cells, for the counters and gauges every request moves.
//!
//! A plain `AtomicU64` behind a per-revision counter is one cache line that every data worker
//! writes on every request, so the line moves between cores each time (the workers share
//! nothing else per request that they could avoid). [`Spread`] gives each thread its own
//! cache-line-sized cell and sums the cells when the metric is read (a scrape). It plugs into
//! prometheus-client as the atomic of a `Counter<u64, Spread>` or `Gauge<i64, Spread>`.

use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering::Relaxed};

use prometheus_client::metrics::{counter, gauge};

/// Cells per value: enough for the data workers of most machines; threads beyond share cells
/// (correct, only less spread).
const CELLS: usize = 8;

/// One cell on its own cache line (two lines: adjacent-line prefetch pairs them on x86).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Cell(AtomicI64);

/// A counter or gauge value kept as one cell per thread (see the module doc).
#[derive(Debug, Default)]
pub struct Spread {
    cells: [Cell; CELLS],
}

static NEXT_CELL: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's cell, handed out round-robin at its first use.
    static CELL: usize = NEXT_CELL.fetch_add(1, Relaxed) % CELLS;
}

impl Spread {
    fn mine(&self) -> &AtomicI64 {
        &self.cells[CELL.with(|c| *c)].0
    }

    fn sum(&self) -> i64 {
        self.cells.iter().map(|c| c.0.load(Relaxed)).sum()
    }

    /// Adds `v` (negative to subtract) on this thread's cell. Returns 0, not the total before:
    /// that needs every cell read, and reading a cell another core writes pulls its line over
    /// (the very transfer the cells avoid). No caller in thaw uses the value.
    fn add(&self, v: i64) -> i64 {
        self.mine().fetch_add(v, Relaxed);
        0
    }
}

impl counter::Atomic<u64> for Spread {
    fn inc(&self) -> u64 {
        self.inc_by(1)
    }

    /// Returns 0: the total before would need every cell read, and no caller in thaw uses it.
    fn inc_by(&self, v: u64) -> u64 {
        self.mine().fetch_add(v as i64, Relaxed);
        0
    }

    fn get(&self) -> u64 {
        self.sum().max(0) as u64
    }
}

impl gauge::Atomic<i64> for Spread {
    fn inc(&self) -> i64 {
        self.add(1)
    }

    fn inc_by(&self, v: i64) -> i64 {
        self.add(v)
    }

    fn dec(&self) -> i64 {
        self.add(-1)
    }

    fn dec_by(&self, v: i64) -> i64 {
        self.add(-v)
    }

    /// Sets the total: this thread's cell takes `v` minus what the others hold. Exact when no
    /// other thread moves the value meanwhile; a concurrent move is kept, not lost.
    fn set(&self, v: i64) -> i64 {
        let before = self.sum();
        self.mine().fetch_add(v - before, Relaxed);
        before
    }

    fn get(&self) -> i64 {
        self.sum()
    }
}

/// A counter moved on every request.
pub type SpreadCounter = prometheus_client::metrics::counter::Counter<u64, Spread>;
/// A gauge moved on every request.
pub type SpreadGauge = prometheus_client::metrics::gauge::Gauge<i64, Spread>;

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;
    use prometheus_client::registry::Registry;

    #[test]
    fn threads_count_into_their_own_cells_and_reads_sum_them() {
        let (c, g) = (SpreadCounter::default(), SpreadGauge::default());
        std::thread::scope(|s| {
            for _ in 0..12 {
                s.spawn(|| {
                    for _ in 0..1000 {
                        c.inc();
                        g.inc();
                        g.dec();
                    }
                    g.inc();
                });
            }
        });
        assert_eq!(c.get(), 12_000);
        assert_eq!(g.get(), 12);
        let used = g.value_cells_in_use();
        assert!(used >= 2, "12 threads used {used} cells");
        g.set(5);
        assert_eq!(g.get(), 5);
        g.dec_by(7);
        assert_eq!(g.get(), -2);
    }

    #[test]
    fn encodes_as_a_counter_and_a_gauge() {
        let mut r = Registry::default();
        let (c, g) = (SpreadCounter::default(), SpreadGauge::default());
        r.register("answers", "Answers", c.clone());
        r.register("busy", "Busy", g.clone());
        c.inc_by(3);
        g.inc_by(4);
        let mut out = String::new();
        encode(&mut out, &r).unwrap();
        assert!(
            out.contains("# TYPE answers counter\nanswers_total 3\n"),
            "{out}"
        );
        assert!(out.contains("# TYPE busy gauge\nbusy 4\n"), "{out}");
    }

    trait CellsInUse {
        fn value_cells_in_use(&self) -> usize;
    }

    impl CellsInUse for SpreadGauge {
        fn value_cells_in_use(&self) -> usize {
            self.inner()
                .cells
                .iter()
                .filter(|c| c.0.load(Relaxed) != 0)
                .count()
        }
    }
}
