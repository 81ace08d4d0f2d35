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
    ON_AGENT_RUNTIME.set(true);
    priority.apply_to_this_thread();
    #[cfg(feature = "mcp")]
    crate::mcp::quiet::on_this_thread();
}

thread_local! {
    /// Set on the plugin's runtime's threads (its workers, and its blocking pool's threads).
    static ON_AGENT_RUNTIME: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this thread is one of the plugin's runtime's: a worker there may block in `block_in_place` (tokio allows
/// it on a multi-threaded runtime's workers and, doing nothing, outside any runtime; it panics on a thread that
/// entered a runtime some other way, such as a current-thread runtime's `block_on`).
pub(crate) fn on_agent_runtime() -> bool {
    ON_AGENT_RUNTIME.get()
}

/// The plugin's tokio runtime (named worker threads `agent-tools-worker`, at the plugin's [`WorkerPriority`]).
/// Use its handle to run I/O from `close` and return a [`Completion`](crate::Completion) with
/// [`Completion::spawn`](crate::Completion::spawn).
#[derive(Resource)]
pub struct AgentRuntime {
    runtime: Option<tokio::runtime::Runtime>,
    handle: tokio::runtime::Handle,
}

impl std::fmt::Debug for AgentRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentRuntime").field("handle", &self.handle).finish_non_exhaustive()
    }
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
            if tokio::runtime::Handle::try_current().is_ok() {
                // A game that runs its app inside a runtime of its own (`#[tokio::main]`): tokio refuses to block
                // there (a panic at every exit). Stopped on a thread of its own, the grace kept; without one (no
                // thread to be had), in the background, as a drop inside a runtime is.
                let slot = std::sync::Arc::new(parking_lot::Mutex::new(Some(runtime)));
                let taken = slot.clone();
                let stopping = std::thread::Builder::new().name("agent-tools-stop".into()).spawn(move || {
                    if let Some(runtime) = taken.lock().take() {
                        runtime.shutdown_timeout(grace);
                    }
                });
                match stopping {
                    Ok(stopping) => drop(stopping.join()),
                    Err(_) => {
                        if let Some(runtime) = slot.lock().take() {
                            runtime.shutdown_background();
                        }
                    }
                }
            } else {
                runtime.shutdown_timeout(grace);
            }
        }
    }
}

/// Runs `work` where tokio's timers and sockets work: in place when it is polled on `runtime` (the plugin's), else
/// on `runtime`, aborted if the returned future is dropped first. So an async API of the crate can be awaited from
/// any executor (Bevy's task pools, `block_on`, a tokio runtime of the game's own, which may have no timers) and
/// not only from the plugin's. `Err` when the work panicked or the runtime stopped under it.
pub(crate) async fn on_tokio<T: Send + 'static>(
    runtime: &tokio::runtime::Handle,
    work: impl Future<Output = T> + Send + 'static,
) -> Result<T, tokio::task::JoinError> {
    if tokio::runtime::Handle::try_current().is_ok_and(|current| current.id() == runtime.id()) {
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

/// How long dropping the runtime without `AppExit` (a panic that unwound the app) waits for its tasks to be
/// dropped: an agent process is killed when its connection's task is dropped, which must happen before the game's
/// process exits.
const DROP_GRACE: Duration = Duration::from_secs(1);

impl Drop for AgentRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            if tokio::runtime::Handle::try_current().is_ok() {
                // Inside a runtime, blocking is not allowed: its tasks are dropped on its threads as they stop.
                runtime.shutdown_background();
            } else {
                runtime.shutdown_timeout(DROP_GRACE);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::{AgentRuntime, WorkerPriority};

    #[test]
    fn dropping_the_runtime_without_app_exit_drops_its_tasks_before_it_returns() {
        struct SetsOnDrop(Arc<AtomicBool>);
        impl Drop for SetsOnDrop {
            fn drop(&mut self) {
                // As an agent's connection does (it kills the process group), a moment after the drop began.
                std::thread::sleep(Duration::from_millis(50));
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let runtime = AgentRuntime::start(1, WorkerPriority::Normal).expect("a runtime");
        let dropped = Arc::new(AtomicBool::new(false));
        let (started, running) = std::sync::mpsc::channel();
        let guard = SetsOnDrop(dropped.clone());
        runtime.handle().spawn(async move {
            let _guard = guard;
            let _ = started.send(());
            std::future::pending::<()>().await;
        });
        running.recv().expect("the task runs");
        drop(runtime);
        assert!(dropped.load(Ordering::SeqCst), "the task was dropped before the runtime's drop returned");
    }
}
