//! [`AgentRuntime`]: the tokio runtime the plugin owns. Handlers, drivers and close work run on it; it starts
//! with the plugin and stops on `AppExit`, after every close completion and `WorldLifecycle::shutdown`.

mod priority;

use std::future::Future;
use std::time::Duration;

use bevy::prelude::Resource;

pub use priority::WorkerPriority;

/// Each worker thread starts at its priority, with rmcp's log lines quiet (see [`crate::mcp`]:
/// `BEVY_AGENT_TOOLS_RMCP_LOG`).
fn on_worker_start(priority: WorkerPriority) {
    priority.apply_to_this_thread();
    #[cfg(feature = "mcp")]
    crate::mcp::quiet::on_this_thread();
}

/// The plugin's tokio runtime (named worker threads `agent-tools-worker`, at the plugin's [`WorkerPriority`]).
/// Use its handle to run I/O from `close` and return a [`Completion`](crate::Completion) with
/// [`Completion::spawn`](crate::Completion::spawn).
#[derive(Resource)]
pub struct AgentRuntime {
    runtime: Option<tokio::runtime::Runtime>,
    handle: tokio::runtime::Handle,
}

impl AgentRuntime {
    pub(crate) fn start(worker_threads: usize, priority: WorkerPriority) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(worker_threads.max(1))
            .thread_name("agent-tools-worker")
            .on_thread_start(move || on_worker_start(priority))
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        Ok(Self { runtime: Some(runtime), handle })
    }

    /// A handle to spawn work on.
    pub fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }

    /// Whether the runtime was stopped (after `AppExit`).
    pub fn is_stopped(&self) -> bool {
        self.runtime.is_none()
    }

    pub(crate) fn stop(&mut self, grace: Duration) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_timeout(grace);
        }
    }
}

/// Runs `work` where tokio's timers and sockets work: in place when it is polled on a tokio runtime (the plugin's
/// or the game's own), else on `runtime`, aborted if the returned future is dropped first. So an async API of the
/// crate can be awaited from any executor (Bevy's task pools, `block_on`) and not only from tokio. `Err` when
/// the work panicked or the runtime stopped under it.
pub(crate) async fn on_tokio<T: Send + 'static>(
    runtime: &tokio::runtime::Handle,
    work: impl Future<Output = T> + Send + 'static,
) -> Result<T, tokio::task::JoinError> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Ok(work.await);
    }
    struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);
    impl<T> Drop for AbortOnDrop<T> {
        fn drop(&mut self) {
            self.0.abort();
        }
    }
    let mut task = AbortOnDrop(runtime.spawn(work));
    (&mut task.0).await
}

impl Drop for AgentRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
