//! A call's progress reports on their way to its MCP client: in the order they were made, and bounded. When the
//! client takes them slower than the tool makes them (a tool that reports in a tight loop, a slow connection), at
//! most [`BACKLOG`] wait: a new report then takes the place of the latest one waiting, so what the client reads is
//! still in order, ends with the latest report, and memory does not grow with the tool's rate. A client that takes
//! none of them for [`STALL_TIMEOUT`] gets no more of this call's reports.

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
    reports: Mutex<VecDeque<Progress>>,
    added: Notify,
}

impl ProgressQueue {
    /// Queues `report` (in place of the latest one waiting, if [`BACKLOG`] wait).
    pub(crate) fn push(&self, report: Progress) {
        {
            let mut reports = self.reports.lock();
            let full = reports.len() >= BACKLOG;
            match reports.back_mut() {
                Some(latest) if full => *latest = report,
                _ => reports.push_back(report),
            }
        }
        self.added.notify_one();
    }

    /// The oldest report waiting, if any.
    pub(crate) fn pop(&self) -> Option<Progress> {
        self.reports.lock().pop_front()
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
}
