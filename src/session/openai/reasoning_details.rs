//! OpenRouter's `reasoning_details`: a model's reasoning as blocks (`reasoning.text`, `reasoning.summary`,
//! `reasoning.encrypted`), streamed a piece at a time, each piece of a block under the block's `index`. Some models
//! need them back with the tool calls they led to: Gemini's, through OpenRouter, refuse the next request without
//! them ("Function call is missing a thought_signature"). So an answer's blocks are put back together and sent
//! with its tool calls, as they came.

use std::collections::HashMap;

use serde_json::{Map, Value};

/// The fields whose pieces make up a block's text: concatenated. Any other field is the block's as last sent.
const TEXT_FIELDS: [&str; 2] = ["text", "summary"];

/// The most blocks one answer may bring (a model's reasoning comes in a few): past it the answer is abandoned, as
/// one past its size is, rather than held (a server's stream of `[{}]` would otherwise grow it until the turn's
/// timeout, each block a hundred times its size on the wire).
pub(crate) const MAX_BLOCKS: usize = 1_024;

/// An answer's reasoning blocks, as they stream.
#[derive(Debug, Default)]
pub(crate) struct ReasoningDetails {
    blocks: Vec<Map<String, Value>>,
    /// Where the block of each `(index, type)` is: a piece finds its block at once, however many came.
    by_index: HashMap<(String, String), usize>,
}

/// An answer brought more than [`MAX_BLOCKS`] reasoning blocks.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct TooManyBlocks;

impl ReasoningDetails {
    /// Adds a delta's `reasoning_details` (block pieces; anything but an object is not OpenRouter's and is left
    /// out). Returns the bytes added, counted against the answer's bound (an empty piece as its two braces).
    pub(crate) fn add(&mut self, pieces: &[Value]) -> Result<usize, TooManyBlocks> {
        let mut added = 0;
        for piece in pieces {
            let Value::Object(piece) = piece else { continue };
            added += 2 + piece.iter().map(|(key, value)| key.len() + value.to_string().len()).sum::<usize>();
            let key = piece.get("index").map(|index| {
                let kind = piece.get("type").map(Value::to_string).unwrap_or_default();
                (index.to_string(), kind)
            });
            match key.as_ref().and_then(|key| self.by_index.get(key)) {
                Some(&block) => merge(&mut self.blocks[block], piece),
                None if self.blocks.len() == MAX_BLOCKS => return Err(TooManyBlocks),
                None => {
                    if let Some(key) = key {
                        self.by_index.insert(key, self.blocks.len());
                    }
                    self.blocks.push(piece.clone());
                }
            }
        }
        Ok(added)
    }

    /// The blocks, for the answer's message: `None` if none came.
    pub(crate) fn into_value(self) -> Option<Value> {
        (!self.blocks.is_empty()).then(|| Value::Array(self.blocks.into_iter().map(Value::Object).collect()))
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
        let mut add = |pieces: Value| details.add(pieces.as_array().unwrap()).unwrap();
        let summary = |text: &str| json!([{"type": "reasoning.summary", "summary": text, "index": 0}]);
        assert!(add(summary("**Respond")) > 0);
        add(summary("ing"));
        add(json!([{"type": "reasoning.text", "text": "I will ", "index": 1}]));
        add(json!([{"type": "reasoning.text", "text": "call it.", "index": 1, "signature": null}]));
        add(json!([{"type": "reasoning.text", "text": "", "index": 1, "signature": "sig"}]));
        add(json!([{"type": "reasoning.encrypted", "data": "gAAA", "id": "r1"}]));
        assert_eq!(add(json!(["not a block", 7])), 0);
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

    #[test]
    fn an_answer_past_the_most_blocks_is_refused_and_empty_pieces_count_against_its_size() {
        let mut details = ReasoningDetails::default();
        // Pieces of one block, however many, are one block.
        let piece = json!({"type": "reasoning.text", "text": "a", "index": 0});
        assert!(details.add(&vec![piece; 100_000]).is_ok());
        let empty = vec![json!({}); MAX_BLOCKS - 1];
        assert_eq!(details.add(&empty), Ok(2 * (MAX_BLOCKS - 1)), "an empty piece counts as its braces");
        assert_eq!(details.add(&[json!({})]), Err(TooManyBlocks));
        let text = details.into_value().unwrap()[0]["text"].as_str().unwrap().len();
        assert_eq!(text, 100_000);
    }
}
