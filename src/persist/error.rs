//! [`StoreError`]: what can go wrong in the world store, with what a person needs to act on it.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use crate::ids::WorldId;

/// Which kind of name failed validation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameKind {
    /// A world name (a [`WorldId`]): it becomes a directory.
    World,
    /// A document name: it becomes a file inside the world's directory.
    Document,
}

impl fmt::Display for NameKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NameKind::World => "world",
            NameKind::Document => "document",
        })
    }
}

/// Why a world-store operation failed. A failed save is reported through its [`Completion`](crate::Completion)
/// with this error's message, never swallowed.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum StoreError {
    /// A world or document name could escape the data directory or is not portable.
    InvalidName {
        /// World or document.
        kind: NameKind,
        /// The name as given.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Another game process holds this world's lock file.
    Locked {
        /// The world.
        world: WorldId,
        /// The lock file.
        lock_file: PathBuf,
        /// The process id the holder wrote into the lock file, if it could be read.
        holder: Option<u32>,
    },
    /// A file operation failed (including an injected fault).
    Io {
        /// The world.
        world: WorldId,
        /// What the store was doing, e.g. `"writing"`.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        error: Arc<io::Error>,
    },
    /// The snapshot could not be serialized.
    Encode {
        /// The world.
        world: WorldId,
        /// The document.
        document: String,
        /// The serializer's message.
        message: String,
    },
    /// The file is intact but does not hold the type asked for (a schema change, not damage).
    Decode {
        /// The world.
        world: WorldId,
        /// The document.
        document: String,
        /// The file that was read.
        path: PathBuf,
        /// The deserializer's message.
        message: String,
    },
    /// The file is intact but names a codec this build does not know (it was written by a newer version of the
    /// game or of this crate). Not treated as damage: the previous save is not loaded in its place.
    UnknownCodec {
        /// The world.
        world: WorldId,
        /// The document.
        document: String,
        /// The file that was read.
        path: PathBuf,
        /// The codec its header names.
        codec: String,
    },
    /// Neither the document nor its previous save could be read intact.
    Damaged {
        /// The world.
        world: WorldId,
        /// The document.
        document: String,
        /// What is wrong with the primary file.
        primary: String,
        /// What is wrong with the previous save.
        previous: String,
    },
    /// The work was interrupted before it finished (the runtime stopped, or the work panicked).
    Interrupted {
        /// The world.
        world: WorldId,
        /// What happened.
        message: String,
    },
}

impl StoreError {
    pub(crate) fn io(world: &WorldId, action: &'static str, path: impl Into<PathBuf>, error: io::Error) -> Self {
        StoreError::Io { world: world.clone(), action, path: path.into(), error: Arc::new(error) }
    }

    /// Whether this is [`StoreError::Locked`]: another game process is using the world.
    pub fn is_locked(&self) -> bool {
        matches!(self, StoreError::Locked { .. })
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::InvalidName { kind, name, reason } => write!(
                f,
                "invalid {kind} name {name:?}: {reason}; use 1 to {} characters of a-z, 0-9, _ and -",
                super::name::max_len(*kind)
            ),
            StoreError::Locked { world, lock_file, holder } => {
                write!(f, "world `{world}` is in use by another game process")?;
                if let Some(pid) = holder {
                    write!(f, " (pid {pid})")?;
                }
                write!(f, "; close that game first (lock file {})", lock_file.display())
            }
            StoreError::Io { world, action, path, error } => {
                write!(f, "world `{world}`: {action} {} failed: {error}", path.display())
            }
            StoreError::Encode { world, document, message } => {
                write!(f, "world `{world}`: could not serialize document `{document}`: {message}")
            }
            StoreError::Decode { world, document, path, message } => write!(
                f,
                "world `{world}`: document `{document}` ({}) is intact but does not match the expected type: {message}",
                path.display()
            ),
            StoreError::UnknownCodec { world, document, path, codec } => write!(
                f,
                "world `{world}`: document `{document}` ({}) was saved with codec `{codec}`, which this build cannot \
                 read (it reads json and postcard); load it with the version of the game that saved it",
                path.display()
            ),
            StoreError::Damaged { world, document, primary, previous } => write!(
                f,
                "world `{world}`: document `{document}` is damaged ({primary}) and so is its previous save ({previous})"
            ),
            StoreError::Interrupted { world, message } => write!(f, "world `{world}`: interrupted: {message}"),
        }
    }
}

/// A store's error as a tool's, with the store's message, so that a handler can use `?` on a load or a save
/// (`store.load(&world, "player").await?`): `INVALID_INPUT` for a name the store refuses (a document named after an
/// agent's argument), `INTERNAL` for the rest.
impl From<StoreError> for crate::ToolError {
    fn from(error: StoreError) -> Self {
        let code = match error {
            StoreError::InvalidName { .. } => crate::ErrorCode::InvalidInput,
            _ => crate::ErrorCode::Internal,
        };
        crate::ToolError::with_code(code, error.to_string())
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StoreError::Io { error, .. } => Some(&**error),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_error_is_a_tools_internal_error_with_the_stores_message() {
        fn load() -> Result<(), crate::ToolError> {
            let world = WorldId::new("alpha");
            Err(StoreError::Interrupted { world, message: "the game stopped".into() })?
        }
        let error = load().expect_err("the store's error");
        assert_eq!(error.code, crate::ErrorCode::Internal);
        assert_eq!(error.message, "world `alpha`: interrupted: the game stopped");
        let refused: crate::ToolError =
            StoreError::InvalidName { kind: NameKind::Document, name: "../x".into(), reason: "a path".into() }.into();
        assert_eq!(refused.code, crate::ErrorCode::InvalidInput, "{}", refused.message);
    }
}
