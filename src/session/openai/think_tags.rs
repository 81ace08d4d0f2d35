//! A model's thinking inside its answer's text: [`ThinkTags`].
//!
//! Reasoning models (Qwen3, DeepSeek-R1 and their distills) think between `<think>` and `</think>` at the start of
//! their answer. Servers that know the model take that part out into a field of its own (`reasoning_content`); LM
//! Studio for some models, vLLM without a reasoning parser and llama.cpp with `--reasoning-format none` leave it in
//! the text, where the player would read the model's whole chain of thought (and a no-think answer as an empty
//! `<think></think>`). So a text that starts with `<think>` (after white space) is read as thinking up to
//! `</think>`, never shown nor kept as said; what follows is the answer. The tag is looked for only at the start:
//! the same words later in an answer are its text. (A model whose chat template opens the thinking in the prompt
//! itself streams only its end, `</think>`: that thinking is not told apart.)

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// Where the answer's text is.
#[derive(Debug)]
enum State {
    /// At its start: what came so far could still be the opening tag (after the white space it starts with, whose
    /// length in bytes is counted once, not looked at again with every piece).
    Start { so_far: String, blank: usize },
    /// Inside the thinking; the end of what came, which could be the start of the closing tag.
    Thinking(String),
    /// After the thinking (or in an answer without it), before any of its text.
    AfterThinking,
    /// The answer.
    Answer,
}

/// Splits an answer's streamed text into what is shown and what was thought.
#[derive(Debug)]
pub(crate) struct ThinkTags(State);

impl Default for ThinkTags {
    fn default() -> Self {
        Self(State::Start { so_far: String::new(), blank: 0 })
    }
}

/// One piece of the text, split.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Split {
    /// The answer's text in it.
    pub shown: String,
    /// Thinking in it.
    pub thought: String,
}

impl ThinkTags {
    /// Reads the next `piece` of the text.
    pub(crate) fn push(&mut self, piece: &str) -> Split {
        let mut split = Split::default();
        let mut rest = piece.to_string();
        loop {
            match &mut self.0 {
                State::Answer => {
                    split.shown.push_str(&rest);
                    return split;
                }
                State::AfterThinking => {
                    // The line breaks between the thinking and the answer are not the answer's.
                    let answer = rest.trim_start();
                    if answer.is_empty() {
                        return split;
                    }
                    rest = answer.to_string();
                    self.0 = State::Answer;
                }
                State::Start { so_far, blank } => {
                    so_far.push_str(&rest);
                    *blank += so_far[*blank..].len() - so_far[*blank..].trim_start().len();
                    let trimmed = &so_far[*blank..];
                    if let Some(after) = trimmed.strip_prefix(OPEN) {
                        rest = after.to_string();
                        self.0 = State::Thinking(String::new());
                    } else if OPEN.starts_with(trimmed) {
                        // Still possibly the tag (or only white space so far).
                        return split;
                    } else {
                        rest = std::mem::take(so_far);
                        self.0 = State::Answer;
                    }
                }
                State::Thinking(carry) => {
                    carry.push_str(&rest);
                    if let Some(at) = carry.find(CLOSE) {
                        split.thought.push_str(&carry[..at]);
                        rest = carry[at + CLOSE.len()..].to_string();
                        self.0 = State::AfterThinking;
                    } else {
                        // All but what could begin the closing tag.
                        let mut keep = carry.len().saturating_sub(CLOSE.len() - 1);
                        while !carry.is_char_boundary(keep) {
                            keep -= 1;
                        }
                        split.thought.push_str(&carry[..keep]);
                        carry.drain(..keep);
                        return split;
                    }
                }
            }
        }
    }

    /// The text's end: what was held back to tell a tag (an answer of `<thi`), or thinking never closed.
    pub(crate) fn finish(&mut self) -> Split {
        match std::mem::take(self).0 {
            State::Start { so_far, blank } => Split { shown: so_far[blank..].to_string(), thought: String::new() },
            State::Thinking(carry) => Split { shown: String::new(), thought: carry },
            State::AfterThinking | State::Answer => Split::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shown text and the thinking of `pieces`, streamed.
    fn read(pieces: &[&str]) -> (String, String) {
        let mut tags = ThinkTags::default();
        let (mut shown, mut thought) = (String::new(), String::new());
        let mut splits: Vec<Split> = pieces.iter().map(|piece| tags.push(piece)).collect();
        splits.push(tags.finish());
        for split in splits {
            shown.push_str(&split.shown);
            thought.push_str(&split.thought);
        }
        (shown, thought)
    }

    #[test]
    fn thinking_at_the_start_is_not_shown_whatever_the_pieces() {
        let whole = "<think>\nThe player wants a tower.\n</think>\n\nBuilding it now.";
        let expected = ("Building it now.".to_string(), "\nThe player wants a tower.\n".to_string());
        assert_eq!(read(&[whole]), expected);
        // Every split into two pieces, the tags cut anywhere (on character boundaries).
        for at in (1..whole.len()).filter(|at| whole.is_char_boundary(*at)) {
            assert_eq!(read(&[&whole[..at], &whole[at..]]), expected, "cut at {at}");
        }
        let bytes: Vec<String> = whole.chars().map(String::from).collect();
        assert_eq!(read(&bytes.iter().map(String::as_str).collect::<Vec<_>>()), expected, "a character at a time");
        // A no-think answer: an empty block, then the answer.
        assert_eq!(read(&["<think>\n\n</think>\n\n", "Hi"]), ("Hi".to_string(), "\n\n".to_string()));
        assert_eq!(read(&["  <think>é…</think>ok"]), ("ok".to_string(), "é…".to_string()));
    }

    #[test]
    fn an_answer_without_thinking_or_with_the_tag_later_is_shown_as_it_is() {
        assert_eq!(read(&["Hello", ", world"]), ("Hello, world".to_string(), String::new()));
        assert_eq!(read(&["I use <think> tags"]), ("I use <think> tags".to_string(), String::new()));
        assert_eq!(read(&["<th", "ing>"]), ("<thing>".to_string(), String::new()));
        assert_eq!(read(&["<thi"]), ("<thi".to_string(), String::new()), "the answer's end: what was held back");
        // Thinking that never ends: all thought, nothing shown.
        assert_eq!(read(&["<think>hmm", " still"]), (String::new(), "hmm still".to_string()));
    }
}
