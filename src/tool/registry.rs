//! The tools the host knows, by name, and the closest names when an agent asks for one it does not know.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::RwLock;

use super::{ErasedTool, ToolInfo};
use crate::error::{ErrorCode, ToolError};

/// How much of an unknown tool's name an error repeats; a longer name (an agent's input, up to a request's size)
/// gets no suggestions either, which would cost its length times every registered name's.
const NAME_SHOWN: usize = 128;

#[derive(Default)]
pub(crate) struct ToolRegistry {
    tools: RwLock<BTreeMap<String, Arc<dyn ErasedTool>>>,
}

impl ToolRegistry {
    /// Adds a tool; a tool with the same name is replaced (and the replacement logged).
    pub(crate) fn insert(&self, tool: Arc<dyn ErasedTool>) {
        let name = tool.info().name.clone();
        if self.tools.write().insert(name.clone(), tool).is_some() {
            tracing::warn!(tool = %name, "an agent tool with this name was already registered; it was replaced");
        }
    }

    pub(crate) fn get(&self, name: &str) -> Result<Arc<dyn ErasedTool>, ToolError> {
        // The suggestions are worked out after the lock is released: registering a tool never waits for them.
        let names: Vec<String> = {
            let tools = self.tools.read();
            if let Some(tool) = tools.get(name) {
                return Ok(tool.clone());
            }
            if name.len() > NAME_SHOWN {
                Vec::new()
            } else {
                tools.keys().cloned().collect()
            }
        };
        let closest = closest_names(name, names.iter().map(String::as_str));
        let hint = if closest.is_empty() {
            String::from("list the tools to see what exists")
        } else {
            format!("did you mean {}?", closest.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", "))
        };
        let shown = shown_name(name);
        let mut error = ToolError::with_code(ErrorCode::ToolNotFound, format!("no tool named `{shown}`: {hint}"))
            .with_detail("closest", closest);
        error.details.tool = Some(shown);
        Err(error)
    }

    /// The tool named `name`, if it is registered (a cheap handle: its info is read through it, never copied).
    #[cfg(feature = "mcp")]
    pub(crate) fn find(&self, name: &str) -> Option<Arc<dyn ErasedTool>> {
        self.tools.read().get(name).cloned()
    }

    /// Removes the tool named `name`; returns whether there was one.
    pub(crate) fn remove(&self, name: &str) -> bool {
        self.tools.write().remove(name).is_some()
    }

    /// Whether a tool named `name` is registered.
    pub(crate) fn contains(&self, name: &str) -> bool {
        self.tools.read().contains_key(name)
    }

    pub(crate) fn list(&self) -> Vec<ToolInfo> {
        self.tools.read().values().map(|tool| tool.info().clone()).collect()
    }
}

/// A tool name as errors and events repeat it: whole up to [`NAME_SHOWN`] bytes, else cut there (on a character
/// boundary) and marked with `…`.
pub(crate) fn shown_name(name: &str) -> String {
    let end = (0..=NAME_SHOWN.min(name.len())).rev().find(|at| name.is_char_boundary(*at)).unwrap_or(0);
    let mut shown = name[..end].to_string();
    if end < name.len() {
        shown.push('…');
    }
    shown
}

/// Up to three registered names closest to `wanted`, closest first.
fn closest_names<'a>(wanted: &str, names: impl Iterator<Item = &'a str>) -> Vec<String> {
    let wanted = wanted.to_lowercase();
    let mut scored: Vec<(usize, &str)> = names
        .filter_map(|name| {
            let lower = name.to_lowercase();
            let distance = strsim::levenshtein(&wanted, &lower);
            let related = lower.contains(&wanted) || wanted.contains(&lower);
            let near = distance <= (wanted.len().max(lower.len()) / 2).max(2);
            (related || near).then_some((distance, name))
        })
        .collect();
    scored.sort();
    scored.into_iter().take(3).map(|(_, name)| name.to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::{closest_names, ToolRegistry, NAME_SHOWN};
    use crate::error::ErrorCode;

    #[test]
    fn an_unknown_name_of_a_requests_size_is_cut_in_its_error_and_gets_no_suggestions() {
        let registry = ToolRegistry::default();
        let name = format!("place_block{}", "é".repeat(500_000));
        let Err(error) = registry.get(&name) else { panic!("no such tool") };
        assert_eq!(error.code, ErrorCode::ToolNotFound);
        let shown = error.details.tool.clone().expect("the name it was asked for");
        assert!(shown.len() <= NAME_SHOWN + '…'.len_utf8() && shown.ends_with('…'), "{shown}");
        assert!(name.starts_with(shown.trim_end_matches('…')), "a prefix of the name asked for");
        assert!(error.message.len() < 4 * NAME_SHOWN, "{}", error.message);
        let short = registry.get("place_blok").err().expect("no such tool either");
        assert_eq!(short.details.tool.as_deref(), Some("place_blok"), "a short name is shown whole");
    }

    #[test]
    fn closest_names_prefers_small_edits_and_substrings() {
        let names = ["place_block", "break_block", "look_around", "travel"];
        assert_eq!(closest_names("place_blok", names.into_iter())[0], "place_block");
        assert!(closest_names("block", names.into_iter()).contains(&"break_block".to_string()));
        assert!(closest_names("zzzzzzzzzzzz", names.into_iter()).is_empty());
    }
}
