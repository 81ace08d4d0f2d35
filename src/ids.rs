//! Identifiers of the vocabulary in the crate docs: worlds, dimensions, visits, revisions, requests,
//! conversations, tasks and operations.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(Arc<str>);

        impl $name {
            /// Creates the identifier from any string.
            pub fn new(id: impl AsRef<str>) -> Self {
                Self(Arc::from(id.as_ref()))
            }

            /// The identifier as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?})", stringify!($name), &*self.0)
            }
        }

        impl From<&str> for $name {
            fn from(id: &str) -> Self {
                Self::new(id)
            }
        }

        impl From<String> for $name {
            fn from(id: String) -> Self {
                Self(Arc::from(id))
            }
        }

        impl From<&String> for $name {
            fn from(id: &String) -> Self {
                Self::new(id)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        /// Maps and sets keyed by the identifier are looked up with a `&str`.
        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }
    };
}

macro_rules! counter_id {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub u64);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    };
}

string_id!(
    /// A save the player can load, e.g. its folder name. Stable across runs. With a
    /// [`WorldStore`](crate::persist::WorldStore) it names a directory: 1 to 64 characters of `a-z`, `0-9`, `_`
    /// and `-` ([`WorldStore::check_world`](crate::persist::WorldStore::check_world)).
    WorldId
);
string_id!(
    /// A dimension inside a world (e.g. `"overworld"`, `"nether"`).
    DimensionId
);
string_id!(
    /// One agent connection: an MCP session, or an in-process agent.
    ConversationId
);
string_id!(
    /// An agent-side grouping of calls. Defaults to the conversation id.
    TaskId
);
string_id!(
    /// An agent-chosen key that makes retries of one operation run once (see the replay rules).
    OperationId
);

counter_id!(
    /// One stay in a world, from load to exit. Unique for the process lifetime, never reused.
    VisitId,
    "visit#"
);
counter_id!(
    /// Increments on every relocation inside a visit. Starts at 0 when the visit opens.
    LocationRevision,
    "rev#"
);
counter_id!(
    /// One tool invocation, unique for the process lifetime.
    RequestId,
    "req#"
);

impl LocationRevision {
    /// The revision after this one.
    pub fn next(self) -> Self {
        Self(self.0 + 1)
    }
}

impl TaskId {
    /// The task a call belongs to when it names none: its conversation's, sharing the conversation id's string.
    pub(crate) fn of_conversation(conversation: &ConversationId) -> Self {
        Self(conversation.0.clone())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn an_identifier_is_made_from_a_borrowed_string_and_looked_up_by_str() {
        let name = String::from("alpha");
        let world = WorldId::from(&name);
        let worlds = HashMap::from([(world.clone(), 1)]);
        assert_eq!(worlds.get("alpha"), Some(&1), "Borrow<str> hashes as the str does");
        assert_eq!(world.as_ref(), "alpha");
    }
}
