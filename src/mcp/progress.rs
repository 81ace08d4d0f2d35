//! A call's progress reports on their way to its MCP client: in the order they were made, and bounded. When the
//! client takes them slower than the tool makes them (a tool that reports in a tight loop, a slow connection), at
//! most [`BACKLOG`] wait: a new report then takes the place of the latest one waiting, so what the client reads is
//! still in order, ends with the latest report, and memory does not grow with the tool's rate. A client that takes
//! none of them for [`STALL_TIMEOUT`] gets no more of this call's reports.
//!
//! MCP wants each report's progress to be a number greater than the last one's: a report that is not finite is
//! dropped (JSON has no NaN: it would be sent as `null`, which the TypeScript SDK refuses), and one that does not
//! go forward is dropped too, unless it says something new (a tool that repeats its count to update its message),
//! which is then sent with the least progress greater than the last.

use std::collections::VecDeque;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;

use super::stream_log::STALL_TIMEOUT;
use crate::call::Progress;

/// How many reports may wait for the client.
pub(crate) const BACKLOG: usize = 4_096;

/// The reports of one call not yet sent.
#[derive(Default)]
pub(crate) struct ProgressQueue {
    reports: Mutex<Reports>,
    added: Notify,
}

#[derive(Default)]
struct Reports {
    waiting: VecDeque<Progress>,
    /// The last report queued.
    last: Option<Progress>,
}

impl ProgressQueue {
    /// Queues `report` (in place of the latest one waiting, if [`BACKLOG`] wait), made to go forward as the
    /// module's doc says, or drops it.
    pub(crate) fn push(&self, report: Progress) {
        {
            let mut reports = self.reports.lock();
            let Some(report) = forward(reports.last.as_ref(), report) else { return };
            reports.last = Some(report.clone());
            let full = reports.waiting.len() >= BACKLOG;
            match reports.waiting.back_mut() {
                Some(latest) if full => *latest = report,
                _ => reports.waiting.push_back(report),
            }
        }
        self.added.notify_one();
    }

    /// The oldest report waiting, if any.
    pub(crate) fn pop(&self) -> Option<Progress> {
        self.reports.lock().waiting.pop_front()
    }

    /// The oldest report waiting, once there is one. Cancel-safe: a report is taken only when it is returned.
    pub(crate) async fn next(&self) -> Progress {
        loop {
            let added = self.added.notified();
            if let Some(report) = self.pop() {
                return report;
            }
            added.await;
        }
    }
}

/// `report` as it may follow `last`: `None` if it is not finite, or does not go forward and says nothing new.
fn forward(last: Option<&Progress>, mut report: Progress) -> Option<Progress> {
    if !report.progress.is_finite() {
        return None;
    }
    report.total = report.total.filter(|total| total.is_finite());
    let Some(last) = last else { return Some(report) };
    if report.progress > last.progress {
        return Some(report);
    }
    if report.message.is_none() || report.message == last.message {
        return None;
    }
    report.progress = last.progress.next_up();
    report.progress.is_finite().then_some(report)
}

/// How long one report may take to be handed to the client before the call's later reports are dropped.
pub(crate) const SEND_LIMIT: Duration = STALL_TIMEOUT;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_past_the_backlog_replace_the_latest_waiting_so_order_and_the_last_report_are_kept() {
        let queue = ProgressQueue::default();
        let made = 3 * BACKLOG as u32;
        for step in 1..=made {
            queue.push(Progress { progress: f64::from(step), total: Some(f64::from(made)), message: None });
        }
        let sent: Vec<f64> = std::iter::from_fn(|| queue.pop()).map(|report| report.progress).collect();
        assert_eq!(sent.len(), BACKLOG);
        assert!(sent.windows(2).all(|pair| pair[0] < pair[1]), "in order: {sent:?}");
        assert_eq!(sent[..BACKLOG - 1], (1..BACKLOG).map(|step| step as f64).collect::<Vec<_>>()[..]);
        assert_eq!(sent.last(), Some(&f64::from(made)), "the latest report is the last sent");
    }

    #[test]
    fn every_report_sent_goes_forward_and_is_finite() {
        let queue = ProgressQueue::default();
        let report = |progress: f64, message: Option<&str>| Progress {
            progress,
            total: Some(f64::INFINITY),
            message: message.map(str::to_string),
        };
        queue.push(report(f64::NAN, None));
        queue.push(report(1.0, Some("placing")));
        queue.push(report(1.0, Some("placing")));
        queue.push(report(1.0, Some("placed the first block")));
        queue.push(report(0.5, None));
        queue.push(report(f64::INFINITY, None));
        queue.push(report(2.0, None));
        let sent: Vec<Progress> = std::iter::from_fn(|| queue.pop()).collect();
        let values: Vec<f64> = sent.iter().map(|report| report.progress).collect();
        assert!(values.windows(2).all(|pair| pair[0] < pair[1]), "each greater than the last: {values:?}");
        let messages: Vec<Option<&str>> = sent.iter().map(|report| report.message.as_deref()).collect();
        assert_eq!(messages, [Some("placing"), Some("placed the first block"), None], "what is new is kept");
        assert_eq!((values[0], values[2]), (1.0, 2.0));
        assert!(values[1] > 1.0 && values[1] < 1.0 + 1e-9, "the least step forward: {}", values[1]);
        assert!(sent.iter().all(|report| report.total.is_none()), "an infinite total is left out");
    }
}
