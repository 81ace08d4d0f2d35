//! OpenRouter's `reasoning_details`: a model's reasoning as blocks (`reasoning.text`, `reasoning.summary`,
//! `reasoning.encrypted`), streamed a piece at a time, each piece of a block under the block's `index`. Some models
//! need them back with the tool calls they led to: Gemini's, through OpenRouter, refuse the next request without
//! them ("Function call is missing a thought_signature"). So an answer's blocks are put back together and sent
//! with its tool calls, as they came.

use serde_json::{Map, Value};

/// The fields whose pieces make up a block's text: concatenated. Any other field is the block's as last sent.
const TEXT_FIELDS: [&str; 2] = ["text", "summary"];

/// An answer's reasoning blocks, as they stream.
#[derive(Debug, Default)]
pub(crate) struct ReasoningDetails(Vec<Map<String, Value>>);

impl ReasoningDetails {
    /// Adds a delta's `reasoning_details` (an array of block pieces; anything else is not OpenRouter's and is left
    /// out). Returns the bytes added, counted against the answer's bound.
    pub(crate) fn add(&mut self, pieces: &Value) -> usize {
        let Value::Array(pieces) = pieces else { return 0 };
        let mut added = 0;
        for piece in pieces {
            let Value::Object(piece) = piece else { continue };
            added += piece.iter().map(|(key, value)| key.len() + value.to_string().len()).sum::<usize>();
            let same_block = |block: &&mut Map<String, Value>| {
                piece.get("index").is_some_and(|index| block.get("index") == Some(index))
                    && block.get("type") == piece.get("type")
            };
            match self.0.iter_mut().rev().find(same_block) {
                Some(block) => merge(block, piece),
                None => self.0.push(piece.clone()),
            }
        }
        added
    }

    /// The blocks, for the answer's message: `None` if none came.
    pub(crate) fn into_value(self) -> Option<Value> {
        (!self.0.is_empty()).then(|| Value::Array(self.0.into_iter().map(Value::Object).collect()))
    }
}

/// Adds `piece` to its `block`: text fields concatenated, any other field set as the piece says (a signature, or
/// encrypted data, in the block's last piece).
fn merge(block: &mut Map<String, Value>, piece: &Map<String, Value>) {
    for (key, value) in piece {
        match (TEXT_FIELDS.contains(&key.as_str()), block.get_mut(key), value) {
            (true, Some(Value::String(text)), Value::String(more)) => text.push_str(more),
            (_, _, Value::Null) => {}
            _ => {
                block.insert(key.clone(), value.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_blocks_pieces_are_put_back_together_by_index_and_type_and_others_kept_apart() {
        let mut details = ReasoningDetails::default();
        let summary = |text: &str| json!([{"type": "reasoning.summary", "summary": text, "index": 0}]);
        assert!(details.add(&summary("**Respond")) > 0);
        details.add(&summary("ing"));
        details.add(&json!([{"type": "reasoning.text", "text": "I will ", "index": 1}]));
        details.add(&json!([{"type": "reasoning.text", "text": "call it.", "index": 1, "signature": null}]));
        details.add(&json!([{"type": "reasoning.text", "text": "", "index": 1, "signature": "sig"}]));
        details.add(&json!([{"type": "reasoning.encrypted", "data": "gAAA", "id": "r1"}]));
        assert_eq!(details.add(&json!("not blocks")), 0);
        assert_eq!(
            details.into_value(),
            Some(json!([
                {"type": "reasoning.summary", "summary": "**Responding", "index": 0},
                {"type": "reasoning.text", "text": "I will call it.", "index": 1, "signature": "sig"},
                {"type": "reasoning.encrypted", "data": "gAAA", "id": "r1"},
            ]))
        );
        assert_eq!(ReasoningDetails::default().into_value(), None);
    }
}
