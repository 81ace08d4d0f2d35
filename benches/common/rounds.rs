//! Frame times measured in interleaved rounds (idle, then each load, in short phases), pooled per load over the
//! rounds: the machine drifts over minutes, so each load is compared with idle frames from the same few seconds.

use std::ops::Range;

/// The `q` quantile of `sorted` (nearest rank).
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted.get(((sorted.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(f64::NAN)
}

/// Every frame's time (ms) of every phase, by round, then by phase (the first phase is idle).
pub struct Rounds {
    /// The phases' names; the first is idle.
    pub phases: Vec<&'static str>,
    /// `frames[round][phase]`: that phase's frame times in that round.
    pub frames: Vec<Vec<Vec<f64>>>,
}

impl Rounds {
    /// Every frame of `phase` in `rounds`, sorted.
    pub fn pooled(&self, phase: usize, rounds: Range<usize>) -> Vec<f64> {
        let mut all: Vec<f64> = self
            .frames
            .iter()
            .enumerate()
            .filter(|(round, _)| rounds.contains(round))
            .flat_map(|(_, round)| round[phase].iter().copied())
            .collect();
        all.sort_by(f64::total_cmp);
        all
    }

    /// Prints the pooled table: median, p95, p99 and their ratios to idle, over all rounds and over each half of
    /// them (how stable the figure is).
    pub fn print_pooled(&self, what: &str) {
        let count = self.frames.len();
        let halves = [(0..count, "all"), (0..count / 2, "first half"), (count / 2..count, "second half")];
        println!("| rounds | phase | frames | {what} median | p95 | p99 | median / idle | p99 / idle p99 |");
        println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
        for (rounds, label) in halves {
            let idle = self.pooled(0, rounds.clone());
            for (phase, name) in self.phases.iter().enumerate() {
                let frames = self.pooled(phase, rounds.clone());
                println!(
                    "| {label} | {name} | {} | {:.2} ms | {:.2} ms | {:.2} ms | {:.3} | {:.3} |",
                    frames.len(),
                    quantile(&frames, 0.5),
                    quantile(&frames, 0.95),
                    quantile(&frames, 0.99),
                    quantile(&frames, 0.5) / quantile(&idle, 0.5),
                    quantile(&frames, 0.99) / quantile(&idle, 0.99),
                );
            }
        }
    }
}
