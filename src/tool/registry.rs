//! The tools the host knows, by name, and the closest names when an agent asks for one it does not know.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::RwLock;

use super::{ErasedTool, ToolInfo};
use crate::error::{ErrorCode, ToolError};

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
        let tools = self.tools.read();
        if let Some(tool) = tools.get(name) {
            return Ok(tool.clone());
        }
        let closest = closest_names(name, tools.keys().map(String::as_str));
        let hint = if closest.is_empty() {
            String::from("list the tools to see what exists")
        } else {
            format!("did you mean {}?", closest.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", "))
        };
        let mut error = ToolError::with_code(ErrorCode::ToolNotFound, format!("no tool named `{name}`: {hint}"))
            .with_detail("closest", closest);
        error.details.tool = Some(name.to_string());
        Err(error)
    }

    pub(crate) fn list(&self) -> Vec<ToolInfo> {
        self.tools.read().values().map(|tool| tool.info().clone()).collect()
    }
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
    use super::closest_names;

    #[test]
    fn closest_names_prefers_small_edits_and_substrings() {
        let names = ["place_block", "break_block", "look_around", "travel"];
        assert_eq!(closest_names("place_blok", names.into_iter())[0], "place_block");
        assert!(closest_names("block", names.into_iter()).contains(&"break_block".to_string()));
        assert!(closest_names("zzzzzzzzzzzz", names.into_iter()).is_empty());
    }
}
