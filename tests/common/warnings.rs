//! The WARN and ERROR events code logs while it runs on the test's thread, as text.
#![allow(dead_code)]

use std::sync::Arc;

use parking_lot::Mutex;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// Runs `f` with a subscriber on this thread that keeps WARN and ERROR events (level, then each field as
/// ` name=value`), and returns what `f` returned with them.
pub fn with_warnings<T>(f: impl FnOnce() -> T) -> (T, Vec<String>) {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::registry().with(captured.clone());
    let out = tracing::subscriber::with_default(subscriber, f);
    let lines = captured.0.lock().clone();
    (out, lines)
}

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> Layer<S> for Captured {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        struct Fields(String);
        impl tracing::field::Visit for Fields {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                self.0.push_str(&format!(" {}={value:?}", field.name()));
            }
        }
        if *event.metadata().level() <= tracing::Level::WARN {
            let mut fields = Fields(event.metadata().level().to_string());
            event.record(&mut fields);
            self.0.lock().push(fields.0);
        }
    }
}
