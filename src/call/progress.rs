//! Progress of a long call: a handler reports it through its context; the transport that made the call decides
//! where it goes (MCP sends `notifications/progress` when the client gave a token).

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// One progress report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// How far along (increases with each report).
    pub progress: f64,
    /// The total, when known.
    pub total: Option<f64>,
    /// What is happening, in words.
    pub message: Option<String>,
}

/// Where a call's progress reports go. Cheap to clone; called from the handler's thread.
#[derive(Clone)]
pub struct ProgressSink(Arc<dyn Fn(Progress) + Send + Sync>);

impl ProgressSink {
    /// A sink that hands each report to `report`.
    pub fn new(report: impl Fn(Progress) + Send + Sync + 'static) -> Self {
        Self(Arc::new(report))
    }

    pub(crate) fn send(&self, progress: Progress) {
        (self.0)(progress)
    }
}

impl fmt::Debug for ProgressSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ProgressSink")
    }
}
