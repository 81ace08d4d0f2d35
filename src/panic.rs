//! Turning a caught panic into words for an `INTERNAL` error.

use std::any::Any;

/// The message a panic was raised with, or a placeholder when it carried something else.
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(message) = payload.downcast_ref::<&str>() {
        (*message).to_string()
    } else if let Some(message) = payload.downcast_ref::<String>() {
        message.clone()
    } else {
        String::from("(a panic without a message)")
    }
}
