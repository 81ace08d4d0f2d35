//! [`WorkerPriority`]: how the plugin's worker threads are scheduled against the game's own threads.

use std::cell::Cell;

/// How the operating system schedules the plugin's worker threads (`agent-tools-worker`: tool handlers, the MCP
/// server, agent sessions, close work) against the game's threads (its main thread, Bevy's task pools, the
/// renderer's).
///
/// It matters when the cores are busy: agent work then waits for the game instead of taking time from its frames.
/// It costs the agent nothing when a core is free.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WorkerPriority {
    /// Below the game's threads (the default): on Linux and Android, a nice value 10 above the process's; on macOS
    /// and iOS, the `utility` quality of service; on Windows, `THREAD_PRIORITY_BELOW_NORMAL`. An agent process
    /// the plugin starts (an ACP agent) inherits it on Linux.
    #[default]
    Background,
    /// The same as any other thread of the game.
    Normal,
}

thread_local! {
    /// The priority [`WorkerPriority::apply_to_this_thread`] gave the calling thread.
    static THIS_THREAD: Cell<WorkerPriority> = const { Cell::new(WorkerPriority::Normal) };
}

impl WorkerPriority {
    /// Applies the priority to the calling thread (a worker, as it starts). A refusal by the operating system is
    /// logged once per process, not at each blocking thread the runtime starts, and the worker runs at normal
    /// priority.
    pub(crate) fn apply_to_this_thread(self) {
        if self == Self::Normal {
            return;
        }
        match lower_this_thread() {
            Ok(()) => THIS_THREAD.with(|this| this.set(self)),
            Err(error) => {
                static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
                if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::warn!("agent tools could not lower their worker threads' priority: {error}");
                }
            }
        }
    }

    /// The priority the calling thread was given as a worker (`Normal` for any other thread).
    pub(crate) fn of_this_thread() -> Self {
        THIS_THREAD.with(Cell::get)
    }
}

/// Linux schedules each thread on its own: `getpriority`/`setpriority(PRIO_PROCESS, tid, …)` read and change one
/// thread. The nice value set is the main thread's plus 10, whatever the calling thread's was: a thread started by
/// a worker (tokio's blocking threads are) starts with the worker's nice value, and adding 10 to that again would
/// put it below the workers.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn lower_this_thread() -> std::io::Result<()> {
    #[cfg(target_os = "android")]
    use libc::__errno as errno;
    #[cfg(target_os = "linux")]
    use libc::__errno_location as errno;
    // SAFETY: plain system calls; the process id is its main thread's id; `errno` points at the calling
    // thread's errno.
    unsafe {
        // -1 is also a valid nice value: only errno tells a failure apart.
        *errno() = 0;
        let main_thread = libc::getpriority(libc::PRIO_PROCESS, libc::getpid() as libc::id_t);
        if main_thread == -1 && *errno() != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::setpriority(libc::PRIO_PROCESS, 0, (main_thread + 10).min(19)) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(any(target_os = "macos", target_os = "ios"))]
fn lower_this_thread() -> std::io::Result<()> {
    // SAFETY: sets the calling thread's quality-of-service class; no pointers.
    let result = unsafe { libc::pthread_set_qos_class_self_np(libc::qos_class_t::QOS_CLASS_UTILITY, 0) };
    if result != 0 {
        return Err(std::io::Error::from_raw_os_error(result));
    }
    Ok(())
}

#[cfg(windows)]
fn lower_this_thread() -> std::io::Result<()> {
    use windows_sys::Win32::System::Threading::{GetCurrentThread, SetThreadPriority, THREAD_PRIORITY_BELOW_NORMAL};
    // SAFETY: `GetCurrentThread` returns a pseudo-handle for the calling thread, valid for this call.
    if unsafe { SetThreadPriority(GetCurrentThread(), THREAD_PRIORITY_BELOW_NORMAL) } == 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(not(any(target_os = "linux", target_os = "android", target_os = "macos", target_os = "ios", windows)))]
fn lower_this_thread() -> std::io::Result<()> {
    Err(std::io::Error::new(std::io::ErrorKind::Unsupported, "no thread priorities on this platform"))
}
