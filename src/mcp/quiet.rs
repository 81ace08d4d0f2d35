//! rmcp's own log lines, quiet by default: rmcp logs several INFO lines per connection ("Service initialized as
//! server", "serve finished", "create new session", ...) and an ERROR when a client goes away before its
//! response (an ordinary disconnect), which would fill a game's console.
//!
//! On the plugin's runtime threads (where rmcp runs) events of the `rmcp` targets below WARN are dropped, as are
//! rmcp's two errors for a response nobody waits for any more, and all but one every 10 s of each of its two
//! repeating warnings: a request refused for its `Host` or `Origin` (a web page can send those as fast as it
//! likes), and a request answered with an error (a client's mistake: a tool that does not exist, such as one of a
//! world the game left that an agent keeps calling, or a method the server does not offer). Everything else,
//! the game's own events from the same threads included, goes to the game's subscriber unchanged. To see rmcp's
//! lines, set the environment variable `BEVY_AGENT_TOOLS_RMCP_LOG` to a level (`info`, `debug`, `trace`): rmcp's events at that level and
//! above pass (and then the game's own filter decides, e.g. `RUST_LOG=rmcp=debug`); `off` drops them all.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::level_filters::LevelFilter;
use tracing::span;
use tracing::subscriber::Interest;
use tracing::{Dispatch, Event, Level, Metadata, Subscriber};

/// The variable that turns rmcp's log lines up (or off).
pub const RMCP_LOG_ENV: &str = "BEVY_AGENT_TOOLS_RMCP_LOG";

/// rmcp's messages for a response whose client no longer waits for it.
const DISCONNECT_ERRORS: &[&str] = &["fail to response message", "failed to send pending response during drain"];
/// How rmcp's warnings that repeat start, one per request: for a request refused for its `Host` or `Origin` (a web
/// page can send such requests as fast as it likes), and for a request answered with an error (an agent calling a
/// tool that does not exist, in a loop). At most one of each is logged per [`REPEATS_LOGGED_EVERY`] (at rmcp's
/// `debug`, all).
const REPEATING_WARNINGS: [&str; 2] = ["rejected request with", "response error"];
const REPEATS_LOGGED_EVERY: Duration = Duration::from_secs(10);
/// When each of [`REPEATING_WARNINGS`] was last let through.
static REPEAT_LOGGED: Mutex<[Option<Instant>; 2]> = Mutex::new([None; 2]);

/// Makes rmcp quiet on the calling thread (call it when a runtime thread starts). Does nothing when the game has
/// set no subscriber yet, so a subscriber set later is never hidden from this thread.
pub(crate) fn on_this_thread() {
    if !tracing::dispatcher::has_been_set() {
        return;
    }
    let game = tracing::dispatcher::get_default(Dispatch::clone);
    // The most verbose level the game's subscriber wants, read before this one joins (tracing keeps one maximum
    // for the process; without a hint this subscriber would raise it to TRACE).
    let hint = LevelFilter::current();
    let quiet = Dispatch::new(QuietRmcp { game, rmcp: rmcp_level(), hint });
    // For the thread's whole life: the guard would restore the previous default when dropped.
    std::mem::forget(tracing::dispatcher::set_default(&quiet));
}

/// The most verbose rmcp level that passes: WARN unless the environment says otherwise.
fn rmcp_level() -> LevelFilter {
    std::env::var(RMCP_LOG_ENV).ok().and_then(|level| level.trim().parse().ok()).unwrap_or(LevelFilter::WARN)
}

/// The game's subscriber, minus rmcp's chatter.
struct QuietRmcp {
    game: Dispatch,
    rmcp: LevelFilter,
    hint: LevelFilter,
}

impl QuietRmcp {
    fn is_rmcp(metadata: &Metadata<'_>) -> bool {
        metadata.target() == "rmcp" || metadata.target().starts_with("rmcp::")
    }

    /// Dropped by level (rmcp below its level), before any field is looked at.
    fn hidden(&self, metadata: &Metadata<'_>) -> bool {
        Self::is_rmcp(metadata) && *metadata.level() > self.rmcp
    }

    /// rmcp's error for a response nobody waits for: a client disconnected, which is not the game's error.
    fn ordinary_disconnect(&self, event: &Event<'_>) -> bool {
        if !Self::is_rmcp(event.metadata()) || *event.metadata().level() != Level::ERROR || self.rmcp >= Level::DEBUG {
            return false;
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        DISCONNECT_ERRORS.iter().any(|known| message.0.starts_with(known))
    }

    /// One of rmcp's [`REPEATING_WARNINGS`], when another of its kind was let through less than
    /// [`REPEATS_LOGGED_EVERY`] ago.
    fn repeated_warning(&self, event: &Event<'_>) -> bool {
        if !Self::is_rmcp(event.metadata()) || *event.metadata().level() != Level::WARN || self.rmcp >= Level::DEBUG {
            return false;
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        let Some(kind) = REPEATING_WARNINGS.iter().position(|warning| message.0.starts_with(warning)) else {
            return false;
        };
        let now = Instant::now();
        let mut logged = REPEAT_LOGGED.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if logged[kind].is_some_and(|at| now.saturating_duration_since(at) < REPEATS_LOGGED_EVERY) {
            return true;
        }
        logged[kind] = Some(now);
        false
    }
}

struct Message(String);

impl tracing::field::Visit for Message {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "message" {
            self.0 = value.to_string();
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl Subscriber for QuietRmcp {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        if self.hidden(metadata) {
            // Other threads (the game's subscriber) still decide for themselves: tracing combines the answers.
            return Interest::never();
        }
        self.game.register_callsite(metadata)
    }

    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        !self.hidden(metadata) && self.game.enabled(metadata)
    }

    fn new_span(&self, span: &span::Attributes<'_>) -> span::Id {
        self.game.new_span(span)
    }

    fn record(&self, span: &span::Id, values: &span::Record<'_>) {
        self.game.record(span, values)
    }

    fn record_follows_from(&self, span: &span::Id, follows: &span::Id) {
        self.game.record_follows_from(span, follows)
    }

    fn event(&self, event: &Event<'_>) {
        if !self.ordinary_disconnect(event) && !self.repeated_warning(event) {
            self.game.event(event)
        }
    }

    fn enter(&self, span: &span::Id) {
        self.game.enter(span)
    }

    fn exit(&self, span: &span::Id) {
        self.game.exit(span)
    }

    fn clone_span(&self, id: &span::Id) -> span::Id {
        self.game.clone_span(id)
    }

    fn try_close(&self, id: span::Id) -> bool {
        self.game.try_close(id)
    }

    fn current_span(&self) -> tracing_core::span::Current {
        self.game.current_span()
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(self.hint)
    }
}
