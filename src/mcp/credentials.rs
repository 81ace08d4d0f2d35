//! Per-conversation credentials: bearer tokens that the game mints for one conversation (an in-game agent
//! session) and revokes when it ends.
//!
//! A request presenting such a token is that conversation's, whatever MCP session, `task_id` or client name it
//! sends: the game knows exactly which of its agent sessions made each call. A revoked token is refused (401) like
//! any unknown one.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use super::security::generate_token;
use crate::ids::ConversationId;

/// The conversation a request's credential belongs to, put in the request's extensions by the bearer check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BoundConversation {
    pub conversation: ConversationId,
    /// An in-game agent session's own credential ([`Credentials::mint_for_session`]): its conversation is the
    /// session's, never reopened by a request.
    pub of_session: bool,
}

/// The live per-conversation tokens of a game's MCP server ([`McpServer::credentials`](super::McpServer::credentials)).
/// Cheap to clone; shared by the bearer check and whoever mints them. Only the server makes one: a book of tokens
/// no server checks would mint tokens nothing accepts.
#[derive(Clone)]
pub struct Credentials {
    tokens: Arc<Mutex<HashMap<Arc<str>, BoundConversation>>>,
    /// The last [`REVOKED_KEPT`] tokens revoked: a request presenting one is an ended session's agent still
    /// winding down, not a client set up with the wrong token.
    revoked: Arc<Mutex<std::collections::VecDeque<Arc<str>>>>,
}

/// How many revoked tokens are remembered as such.
const REVOKED_KEPT: usize = 64;

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").field("live", &self.tokens.lock().len()).finish()
    }
}

impl Credentials {
    /// An empty book, for the server being started.
    pub(crate) fn new() -> Self {
        Self { tokens: Arc::default(), revoked: Arc::default() }
    }

    /// Mints a new bearer token for `conversation` (32 random bytes, hex). Every request that presents it is
    /// attributed to `conversation` until [`revoke`](Self::revoke); the conversation opens as any a client names
    /// does (and reopens after it ended, `Ended → Idle`).
    pub fn mint(&self, conversation: &ConversationId) -> Result<String, super::McpConfigError> {
        self.insert(BoundConversation { conversation: conversation.clone(), of_session: false })
    }

    /// Mints the credential of an in-game agent session, whose conversation the session holds: a request that
    /// presents it never opens or reopens that conversation (one that passed the check just before the session
    /// ended is refused, rather than reopening it behind the session's back).
    #[cfg_attr(not(any(feature = "acp", feature = "openai")), allow(dead_code))]
    pub(crate) fn mint_for_session(&self, conversation: &ConversationId) -> Result<String, super::McpConfigError> {
        self.insert(BoundConversation { conversation: conversation.clone(), of_session: true })
    }

    fn insert(&self, bound: BoundConversation) -> Result<String, super::McpConfigError> {
        let token = generate_token()?;
        self.tokens.lock().insert(Arc::from(token.as_str()), bound);
        Ok(token)
    }

    /// Revokes `token`: requests presenting it are refused from now on. Revoking twice does nothing.
    pub fn revoke(&self, token: &str) {
        let Some((token, _)) = self.tokens.lock().remove_entry(token) else { return };
        let mut revoked = self.revoked.lock();
        if revoked.len() == REVOKED_KEPT {
            revoked.pop_front();
        }
        revoked.push_back(token);
    }

    /// Whether `token` is one of the last tokens revoked.
    pub(crate) fn recently_revoked(&self, token: &str) -> bool {
        self.revoked.lock().iter().any(|revoked| **revoked == *token)
    }

    /// The conversation `token` belongs to, if it is live.
    pub(crate) fn conversation_of(&self, token: &str) -> Option<BoundConversation> {
        // A map lookup hashes the presented token: its timing says nothing about the live tokens' bytes.
        self.tokens.lock().get(token).cloned()
    }

    /// How many tokens are live.
    pub fn live(&self) -> usize {
        self.tokens.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minted_credential_names_its_conversation_until_revoked() {
        let credentials = Credentials::new();
        let chat = ConversationId::new("chat-1");
        let token = credentials.mint(&chat).unwrap();
        assert_eq!(
            credentials.conversation_of(&token),
            Some(BoundConversation { conversation: chat.clone(), of_session: false })
        );
        credentials.revoke(&token);
        assert_eq!(credentials.conversation_of(&token), None);
        assert!(credentials.recently_revoked(&token) && !credentials.recently_revoked("another"));
        let later: Vec<String> = (0..REVOKED_KEPT).map(|_| credentials.mint(&chat).unwrap()).collect();
        later.iter().for_each(|token| credentials.revoke(token));
        assert!(!credentials.recently_revoked(&token), "only the last {REVOKED_KEPT} are kept");
        assert_eq!(credentials.live(), 0);
    }
}
