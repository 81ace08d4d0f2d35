//! [`Completion`]: a handle that resolves when work has *actually* finished (data durable, resources released),
//! carrying success or an error. Awaitable on tokio, blockable from any thread, joinable.
//!
//! Nothing here runs on, or waits for, the Bevy main thread: a completion resolves even if the app never updates
//! again.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::signal::OnceSignal;

/// Why a [`Completion`] failed. A failed save is reported, never swallowed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompletionError {
    message: Arc<str>,
}

impl CompletionError {
    /// An error with a message saying what failed and where.
    pub fn new(message: impl fmt::Display) -> Self {
        Self { message: Arc::from(message.to_string()) }
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for CompletionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CompletionError {}

/// A failed completion as a tool's error: `INTERNAL`, with its message, so that a handler can use `?` on what it
/// awaited (`saved.finished().await?`).
impl From<CompletionError> for crate::ToolError {
    fn from(error: CompletionError) -> Self {
        crate::ToolError::internal(error.to_string())
    }
}

/// What a completion resolved to.
pub type CompletionResult = Result<(), CompletionError>;

type Slot = OnceSignal<CompletionResult>;

#[derive(Clone)]
enum Inner {
    Single(Arc<Slot>),
    All(Arc<[Completion]>),
}

/// Resolves when persistence and release have actually finished.
///
/// Returned by [`WorldLifecycle::close`](crate::WorldLifecycle::close) and
/// [`WorldLifecycle::shutdown`](crate::WorldLifecycle::shutdown), and used as the readiness signal of a session
/// that loads asynchronously ([`Opened::loading`](crate::Opened::loading)). Clones observe the same outcome.
///
/// ```
/// use bevy_agent_tools::Completion;
///
/// let (completer, completion) = Completion::pending();
/// std::thread::spawn(move || completer.succeed());
/// assert!(completion.wait().is_ok());
/// ```
#[derive(Clone)]
#[must_use = "a Completion tells when the work finished; wait for it or hand it to the host"]
pub struct Completion {
    inner: Inner,
}

/// The side of a [`Completion`] that resolves it. Dropping it unresolved fails the completion, so a forgotten
/// completer can never leave a waiter hanging.
pub struct Completer {
    slot: Arc<Slot>,
}

impl std::fmt::Debug for Completer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completer").finish_non_exhaustive()
    }
}

impl Completer {
    /// Resolves the completion with this result. Only the first resolution counts.
    pub fn complete(self, result: CompletionResult) {
        self.slot.set(result);
    }

    /// Resolves the completion successfully.
    pub fn succeed(self) {
        self.complete(Ok(()));
    }

    /// Resolves the completion with an error.
    pub fn fail(self, error: impl fmt::Display) {
        self.complete(Err(CompletionError::new(error)));
    }
}

impl Drop for Completer {
    fn drop(&mut self) {
        self.slot.set(Err(CompletionError::new("the work was dropped before it completed")));
    }
}

impl Completion {
    /// A completion and the completer that resolves it.
    pub fn pending() -> (Completer, Completion) {
        let slot = Arc::new(Slot::new());
        (Completer { slot: slot.clone() }, Completion { inner: Inner::Single(slot) })
    }

    /// An already successful completion.
    pub fn done() -> Self {
        Self::resolved(Ok(()))
    }

    /// An already failed completion.
    pub fn failed(error: impl fmt::Display) -> Self {
        Self::resolved(Err(CompletionError::new(error)))
    }

    fn resolved(result: CompletionResult) -> Self {
        let (completer, completion) = Self::pending();
        completer.complete(result);
        completion
    }

    /// Runs `work` on a tokio runtime and resolves with its result. A panic in `work` fails the completion.
    pub fn spawn<F>(runtime: &tokio::runtime::Handle, work: F) -> Self
    where
        F: std::future::Future<Output = CompletionResult> + Send + 'static,
    {
        let (completer, completion) = Self::pending();
        let task = runtime.spawn(work);
        runtime.spawn(async move {
            match task.await {
                Ok(result) => completer.complete(result),
                Err(error) => completer.fail(format_args!("the work panicked or was aborted: {error}")),
            }
        });
        completion
    }

    /// A completion that resolves when all of `completions` have; it fails if any of them fails (with every
    /// failure's message).
    pub fn all(completions: impl IntoIterator<Item = Completion>) -> Self {
        Self { inner: Inner::All(completions.into_iter().collect()) }
    }

    /// The result, if resolved.
    pub fn result(&self) -> Option<CompletionResult> {
        match &self.inner {
            Inner::Single(slot) => slot.get(),
            Inner::All(parts) => {
                let mut errors = Vec::new();
                for part in parts.iter() {
                    match part.result()? {
                        Ok(()) => {}
                        Err(error) => errors.push(error),
                    }
                }
                Some(join_errors(errors))
            }
        }
    }

    /// Whether it has resolved.
    pub fn is_done(&self) -> bool {
        self.result().is_some()
    }

    /// Blocks this thread until resolved. Do not call it on the Bevy main thread in a frame. In async code (a
    /// tool's handler) await [`finished`](Self::finished) instead: a handler that blocks holds a thread while it
    /// waits, and its call's timeout cannot end it meanwhile (the work it waits for still runs, on another
    /// worker).
    pub fn wait(&self) -> CompletionResult {
        loop {
            if let Some(result) = self.wait_until(Instant::now() + Duration::from_secs(3600)) {
                return result;
            }
        }
    }

    /// Blocks this thread until resolved or until `timeout` passed; `None` if it had not resolved by then.
    pub fn wait_timeout(&self, timeout: Duration) -> Option<CompletionResult> {
        self.wait_until(crate::deadline::after(Instant::now(), timeout))
    }

    fn wait_until(&self, deadline: Instant) -> Option<CompletionResult> {
        match &self.inner {
            Inner::Single(slot) => slot.wait_until(deadline),
            Inner::All(parts) => {
                let mut errors = Vec::new();
                for part in parts.iter() {
                    if let Err(error) = part.wait_until(deadline)? {
                        errors.push(error);
                    }
                }
                Some(join_errors(errors))
            }
        }
    }

    /// Waits asynchronously until resolved. Cancel-safe: dropping the future loses nothing.
    pub async fn finished(&self) -> CompletionResult {
        match &self.inner {
            Inner::Single(slot) => slot.wait().await,
            Inner::All(parts) => {
                let mut errors = Vec::new();
                for part in parts.iter() {
                    if let Err(error) = Box::pin(part.finished()).await {
                        errors.push(error);
                    }
                }
                join_errors(errors)
            }
        }
    }
}

fn join_errors(mut errors: Vec<CompletionError>) -> CompletionResult {
    match errors.len() {
        0 => Ok(()),
        1 => Err(errors.remove(0)),
        _ => Err(CompletionError::new(errors.iter().map(|e| e.message()).collect::<Vec<_>>().join("; "))),
    }
}

impl fmt::Debug for Completion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Completion").field("result", &self.result()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wait on a thread that entered a multi-threaded runtime some other way than as its worker (inside a
    /// current-thread runtime's `block_on`, the handle of another entered) blocks as any wait does: tokio's
    /// `block_in_place`, which the plugin's workers wait in, would panic there.
    #[test]
    fn a_wait_inside_a_current_thread_runtime_that_entered_a_multi_threaded_one_blocks_without_panicking() {
        let multi = tokio::runtime::Builder::new_multi_thread().worker_threads(1).build().expect("a runtime");
        let current = tokio::runtime::Builder::new_current_thread().build().expect("a runtime");
        let (completer, completion) = Completion::pending();
        let resolving = std::thread::spawn(move || completer.succeed());
        current.block_on(async {
            let _entered = multi.handle().enter();
            assert!(completion.wait().is_ok());
        });
        resolving.join().expect("resolved");
    }
}
