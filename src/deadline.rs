//! Deadlines from durations a game configures. `Duration::MAX` (or any wait too long for the clock) is a natural way
//! to say "no limit", and `Instant + Duration` panics on it: here it is a deadline that never comes instead.

use std::time::{Duration, Instant};

/// About a century: later than anything a running game waits for.
const NEVER: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);
/// Nearer horizons, for a clock that cannot say a century from now (FreeBSD's, say): still far past any game's run.
const NEARER: [Duration; 2] = [Duration::from_secs(30 * 365 * 24 * 60 * 60), Duration::from_secs(365 * 24 * 60 * 60)];

/// `wait` after `from`, or a century after it (or as far as the clock can say) when `wait` is longer.
pub(crate) fn after(from: Instant, wait: Duration) -> Instant {
    let wait = wait.min(NEVER);
    std::iter::once(wait)
        .chain(NEARER.into_iter().filter(|nearer| *nearer < wait))
        .find_map(|wait| from.checked_add(wait))
        .unwrap_or(from)
}

/// [`after`] for tokio's clock.
pub(crate) fn after_tokio(from: tokio::time::Instant, wait: Duration) -> tokio::time::Instant {
    tokio::time::Instant::from_std(after(from.into_std(), wait))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_too_long_for_the_clock_is_a_deadline_a_century_away_not_a_panic() {
        let now = Instant::now();
        assert_eq!(after(now, Duration::from_secs(5)), now + Duration::from_secs(5));
        assert_eq!(after(now, Duration::MAX), now + NEVER);
        let now = tokio::time::Instant::now();
        assert_eq!(after_tokio(now, Duration::MAX), now + NEVER);
    }
}
