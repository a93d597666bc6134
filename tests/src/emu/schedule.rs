//! Handoff schedules: when the MH is in which cells, on the emulator's own clock.

use serde::{Deserialize, Serialize};

/// How the MH moves from one cell to the next.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case", deny_unknown_fields)]
pub enum Crossing {
    /// The MH is in both cells for `overlap_s` seconds, starting at the switch instant.
    Overlap { overlap_s: f64 },
    /// The MH is in no cell for `gap_s` seconds (0 = leave one and enter the next at once).
    Gap { gap_s: f64 },
}

/// Switch cells every `period_s` seconds, visiting `cells` in order and cycling.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Schedule {
    /// Cell numbers (1-based, MSR1 = cell 1), e.g. `[1, 2]` for back and forth.
    pub cells: Vec<usize>,
    pub period_s: f64,
    /// e.g. `{"mode": "gap", "gap_s": 1.0}` or `{"mode": "overlap", "overlap_s": 2.0}`.
    pub crossing: Crossing,
    /// Stop after this many switches (none: until replaced or stopped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_switches: Option<u64>,
}

impl Schedule {
    pub fn validate(&self, n_cells: usize) -> Result<(), String> {
        if self.cells.len() < 2 {
            return Err("a schedule needs at least two cells to move between".into());
        }
        if let Some(c) = self.cells.iter().find(|&&c| c == 0 || c > n_cells) {
            return Err(format!("cell {c} does not exist (cells are 1..={n_cells})"));
        }
        if self.period_s.is_nan() || self.period_s <= 0.0 {
            return Err(format!("period_s must be > 0, got {}", self.period_s));
        }
        let d = match self.crossing {
            Crossing::Overlap { overlap_s } => overlap_s,
            Crossing::Gap { gap_s } => gap_s,
        };
        if !(0.0..self.period_s).contains(&d) {
            return Err(format!(
                "overlap/gap must be in [0, period_s), got {d} with period_s {}",
                self.period_s
            ));
        }
        Ok(())
    }

    fn cell(&self, k: u64) -> usize {
        self.cells[(k % self.cells.len() as u64) as usize]
    }

    /// The association changes of switch number `k` (k ≥ 1), as (offset from the
    /// schedule's start in ns, cells associated from then on).
    pub fn switch(&self, k: u64) -> Vec<(u64, Vec<usize>)> {
        let at = secs_ns(self.period_s * k as f64);
        let (old, new) = (self.cell(k - 1), self.cell(k));
        match self.crossing {
            Crossing::Overlap { overlap_s } if overlap_s > 0.0 => vec![
                (at, sorted(vec![old, new])),
                (at + secs_ns(overlap_s), vec![new]),
            ],
            Crossing::Gap { gap_s } if gap_s > 0.0 => {
                vec![(at, vec![]), (at + secs_ns(gap_s), vec![new])]
            }
            _ => vec![(at, vec![new])],
        }
    }

    /// Cells at the schedule's start.
    pub fn initial(&self) -> Vec<usize> {
        vec![self.cell(0)]
    }

    /// Fraction of the time in [0, horizon_s) in which the MH has at least one cell.
    pub fn coverage(&self, horizon_s: f64) -> f64 {
        let gap = match self.crossing {
            Crossing::Gap { gap_s } => gap_s,
            Crossing::Overlap { .. } => return 1.0,
        };
        let mut dark = 0.0;
        let mut k = 1u64;
        loop {
            if self.max_switches.is_some_and(|m| k > m) {
                break;
            }
            let at = self.period_s * k as f64;
            if at >= horizon_s {
                break;
            }
            dark += gap.min(horizon_s - at);
            k += 1;
        }
        1.0 - dark / horizon_s
    }
}

fn sorted(mut v: Vec<usize>) -> Vec<usize> {
    v.sort_unstable();
    v.dedup();
    v
}

pub fn secs_ns(s: f64) -> u64 {
    (s * 1e9).round() as u64
}

/// A schedule in progress: yields association changes as time passes.
#[derive(Debug, Clone)]
pub struct Running {
    pub schedule: Schedule,
    pub start_ns: u64,
    next_switch: u64,
    pending: Vec<(u64, Vec<usize>)>,
}

impl Running {
    pub fn new(schedule: Schedule, start_ns: u64) -> Self {
        Self {
            schedule,
            start_ns,
            next_switch: 1,
            pending: Vec::new(),
        }
    }

    fn refill(&mut self) {
        if self.pending.is_empty()
            && self
                .schedule
                .max_switches
                .is_none_or(|m| self.next_switch <= m)
        {
            let mut ev = self.schedule.switch(self.next_switch);
            for e in &mut ev {
                e.0 += self.start_ns;
            }
            ev.reverse(); // pop() from the back yields them in time order
            self.pending = ev;
            self.next_switch += 1;
        }
    }

    /// Time of the next association change, if any.
    pub fn next_event(&mut self) -> Option<u64> {
        self.refill();
        self.pending.last().map(|e| e.0)
    }

    /// Pops the next change if it is due at `now`.
    pub fn pop_due(&mut self, now: u64) -> Option<(u64, Vec<usize>)> {
        self.refill();
        if self.pending.last().is_some_and(|e| e.0 <= now) {
            self.pending.pop()
        } else {
            None
        }
    }

    pub fn finished(&mut self) -> bool {
        self.next_event().is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sched(crossing: Crossing) -> Schedule {
        Schedule {
            cells: vec![1, 2],
            period_s: 8.0,
            crossing,
            max_switches: None,
        }
    }

    #[test]
    fn overlap_switches() {
        let s = sched(Crossing::Overlap { overlap_s: 2.0 });
        assert_eq!(s.initial(), vec![1]);
        assert_eq!(
            s.switch(1),
            vec![(8_000_000_000, vec![1, 2]), (10_000_000_000, vec![2])]
        );
        assert_eq!(
            s.switch(2),
            vec![(16_000_000_000, vec![1, 2]), (18_000_000_000, vec![1])]
        );
        assert_eq!(s.coverage(100.0), 1.0);
    }

    #[test]
    fn gap_switches_and_coverage() {
        let s = sched(Crossing::Gap { gap_s: 1.0 });
        assert_eq!(
            s.switch(1),
            vec![(8_000_000_000, vec![]), (9_000_000_000, vec![2])]
        );
        // Gaps at 8, 16, 24, 32 within 40 s: 4 s dark.
        assert!((s.coverage(40.0) - 0.9).abs() < 1e-9);
        let z = sched(Crossing::Gap { gap_s: 0.0 });
        assert_eq!(z.switch(1), vec![(8_000_000_000, vec![2])]);
        assert_eq!(z.coverage(40.0), 1.0);
    }

    #[test]
    fn running_yields_in_order() {
        let mut r = Running::new(
            Schedule {
                max_switches: Some(2),
                ..sched(Crossing::Gap { gap_s: 1.0 })
            },
            1000,
        );
        let mut got = Vec::new();
        while let Some(t) = r.next_event() {
            got.push(r.pop_due(t).unwrap());
        }
        assert_eq!(
            got,
            vec![
                (8_000_001_000, vec![]),
                (9_000_001_000, vec![2]),
                (16_000_001_000, vec![]),
                (17_000_001_000, vec![1]),
            ]
        );
        assert!(r.finished());
    }

    #[test]
    fn validation() {
        let mut s = sched(Crossing::Gap { gap_s: 9.0 });
        assert!(s.validate(2).is_err());
        s.crossing = Crossing::Gap { gap_s: 1.0 };
        assert!(s.validate(2).is_ok());
        s.cells = vec![1, 3];
        assert!(s.validate(2).unwrap_err().contains("cell 3"));
    }
}
