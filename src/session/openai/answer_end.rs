//! Whether a streamed answer reached its end. `async-openai` ends the stream alike at `data: [DONE]` and when the
//! connection closes before it, so an answer cut short (a proxy or a crashed server closing the body mid-answer)
//! would read as a whole one: half a sentence as the turn's end, the first of two tool calls run and the second
//! lost. The body is watched on its way to the client: if it ends without `data: [DONE]`, the stream ends with an
//! error, which fails the turn unless its answer had already said how it finished (a `finish_reason`: some
//! servers send no `[DONE]`).
//!
//! The watch also passes on an error the server sent outside the stream's `data:` lines: llama.cpp's server
//! reports a failure mid-stream as a line `error: {"code": ..., "message": ...}`, then closes. An SSE reader
//! ignores a field it does not know, so the player would read only that the answer broke off; the line is handed
//! on as the chunk `data: {"error": ...}` too, which the turn reports with the server's words.
//!
//! And it makes the body valid UTF-8 as the SSE standard decodes it: a byte that is not (a server that cut a
//! character between two tokens) becomes U+FFFD, where the client's SSE reader would end the whole answer with
//! an encoding error at it. A character split between two chunks is joined first.

use std::error::Error;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_util::Stream;
use serde_json::Value;

/// The end marker, as servers send it (with or without the space), at the start of a line: not the same words
/// inside an answer's text (which is JSON in a `data:` line of its own).
const MARKERS: [&[u8]; 2] = [b"\ndata: [DONE]", b"\ndata:[DONE]"];
/// Enough of the previous chunk to find a marker split across two.
const CARRY: usize = 16;
/// The field of an error line, at the start of a line.
const ERROR_FIELD: &[u8] = b"error:";
/// The most of an error line kept (the message quoted from it is shorter still).
const ERROR_LINE_LIMIT: usize = 64 * 1024;
/// U+FFFD REPLACEMENT CHARACTER, in UTF-8: what a byte that is not UTF-8 is read as.
const REPLACEMENT: &[u8] = "\u{FFFD}".as_bytes();
/// The most one event (the bytes up to a blank line) may take: the SSE reader keeps an event whole until it ends,
/// so a server that streams one without end would otherwise fill memory while the stall timeout never fires.
const EVENT_LIMIT: usize = super::client::WHOLE_ANSWER_LIMIT;

/// When the endpoint last sent bytes of an answer: any, also what the SSE reader passes over (the `: keep-alive`
/// comments DeepSeek and OpenRouter send while a request waits its turn), so that the stall timeout counts only
/// true silence. One per session: its turns' requests come one at a time.
#[derive(Clone)]
pub(crate) struct Heard(Arc<parking_lot::Mutex<Instant>>);

impl Heard {
    pub(crate) fn new() -> Self {
        Self(Arc::new(parking_lot::Mutex::new(Instant::now())))
    }

    /// Bytes came (or a request opened) now.
    pub(crate) fn now(&self) {
        *self.0.lock() = Instant::now();
    }

    /// How long ago bytes last came.
    pub(crate) fn since(&self) -> Duration {
        self.0.lock().elapsed()
    }
}

/// The answer's body, passed on as it is (with each error line also as a `data:` chunk), with an error at its end if
/// it never said `data: [DONE]`.
pub(crate) struct DoneWatch<S> {
    body: S,
    /// The end of the previous chunk.
    tail: Vec<u8>,
    /// The current line so far: its start, enough to tell an error line, and all of an error line (up to a bound).
    line: Vec<u8>,
    done: bool,
    /// The body gave its last chunk.
    body_ended: bool,
    ended: bool,
    /// Bytes since the last blank line (the current event's), and whether the last line so far was empty.
    in_event: usize,
    blank: bool,
    /// The start of a character the previous chunk ended in the middle of (at most 3 bytes).
    split_char: Vec<u8>,
    /// Told of every chunk of the body.
    heard: Option<Heard>,
}

impl<S> DoneWatch<S> {
    pub(crate) fn new(body: S) -> Self {
        // The body's start is a line's start.
        Self {
            body,
            tail: b"\n".to_vec(),
            line: Vec::new(),
            done: false,
            body_ended: false,
            ended: false,
            in_event: 0,
            blank: true,
            split_char: Vec::new(),
            heard: None,
        }
    }

    /// Tells `heard` of every chunk of the body.
    pub(crate) fn hearing(mut self, heard: Heard) -> Self {
        self.heard = Some(heard);
        self
    }

    /// `chunk` as valid UTF-8 (after the start of a character the previous one ended in, and without the start of
    /// one it ends in), each byte that is not UTF-8 as U+FFFD; `None` if it is that already.
    fn valid_utf8(&mut self, chunk: &[u8]) -> Option<Vec<u8>> {
        if self.split_char.is_empty() && std::str::from_utf8(chunk).is_ok() {
            return None;
        }
        let mut bytes = std::mem::take(&mut self.split_char);
        bytes.extend_from_slice(chunk);
        let mut valid = Vec::with_capacity(bytes.len());
        let mut rest = &bytes[..];
        while let Err(error) = std::str::from_utf8(rest) {
            let (good, after) = rest.split_at(error.valid_up_to());
            valid.extend_from_slice(good);
            match error.error_len() {
                Some(bad) => {
                    valid.extend_from_slice(REPLACEMENT);
                    rest = &after[bad..];
                }
                // A character the next chunk may finish.
                None => {
                    self.split_char = after.to_vec();
                    rest = &[];
                }
            }
        }
        valid.extend_from_slice(rest);
        Some(valid)
    }

    /// Counts `chunk` into the current event. Returns whether the event is still within [`EVENT_LIMIT`].
    fn within_event_limit(&mut self, chunk: &[u8]) -> bool {
        for &byte in chunk {
            match byte {
                b'\n' if self.blank => self.in_event = 0,
                b'\n' => self.blank = true,
                b'\r' => {}
                _ => self.blank = false,
            }
            self.in_event += 1;
        }
        self.in_event <= EVENT_LIMIT
    }

    fn scan(&mut self, chunk: &[u8]) {
        if self.done {
            return;
        }
        self.tail.extend_from_slice(chunk);
        self.done = MARKERS.iter().any(|marker| self.tail.windows(marker.len()).any(|window| window == *marker));
        let keep = self.tail.len().saturating_sub(CARRY);
        self.tail.drain(..keep);
    }

    /// The chunk with the `data:` chunk of each error line it ends put right after that line, or `None` if it ends
    /// none.
    fn with_errors(&mut self, chunk: &[u8]) -> Option<Vec<u8>> {
        let mut out: Option<Vec<u8>> = None;
        let mut passed = 0;
        for (at, &byte) in chunk.iter().enumerate() {
            if byte != b'\n' {
                let wanted = self.line.len() < ERROR_FIELD.len()
                    || (self.line.starts_with(ERROR_FIELD) && self.line.len() < ERROR_LINE_LIMIT);
                if wanted {
                    self.line.push(byte);
                }
                continue;
            }
            if let Some(event) = self.error_event() {
                let out = out.get_or_insert_with(Vec::new);
                out.extend_from_slice(&chunk[passed..=at]);
                out.extend_from_slice(&event);
                passed = at + 1;
            }
            self.line.clear();
        }
        let mut out = out?;
        out.extend_from_slice(&chunk[passed..]);
        Some(out)
    }

    /// The `data:` chunk standing for the current line if it is an error line: its text as JSON if it is JSON, else
    /// as a string. A blank line before it ends any event the line was part of.
    fn error_event(&self) -> Option<Vec<u8>> {
        let text = self.line.strip_prefix(ERROR_FIELD)?;
        let text = String::from_utf8_lossy(text);
        let text = text.trim();
        let error = serde_json::from_str::<Value>(text).unwrap_or_else(|_| Value::String(text.to_string()));
        Some(format!("\ndata: {}\n\n", serde_json::json!({ "error": error })).into_bytes())
    }
}

/// The error a body ends with once one event passed [`EVENT_LIMIT`].
#[derive(Debug)]
pub(crate) struct EventTooLong;

impl std::fmt::Display for EventTooLong {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "one event of the answer passed {} MiB without ending: the answer was abandoned", EVENT_LIMIT >> 20)
    }
}

impl Error for EventTooLong {}

/// The error a body that ended without `data: [DONE]` ends with.
#[derive(Debug)]
pub(crate) struct CutShort;

impl std::fmt::Display for CutShort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the answer ended before its end (no `data: [DONE]`)")
    }
}

impl Error for CutShort {}

impl<S, B, E> Stream for DoneWatch<S>
where
    S: Stream<Item = Result<B, E>> + Unpin,
    B: AsRef<[u8]> + From<Vec<u8>>,
    E: Into<Box<dyn Error + Send + Sync>>,
{
    type Item = Result<B, Box<dyn Error + Send + Sync>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.ended {
            return Poll::Ready(None);
        }
        if !self.body_ended {
            match Pin::new(&mut self.body).poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(chunk))) => {
                    if let Some(heard) = &self.heard {
                        heard.now();
                    }
                    let chunk = match self.valid_utf8(chunk.as_ref()) {
                        Some(valid) => B::from(valid),
                        None => chunk,
                    };
                    if !self.within_event_limit(chunk.as_ref()) {
                        self.ended = true;
                        return Poll::Ready(Some(Err(Box::new(EventTooLong))));
                    }
                    self.scan(chunk.as_ref());
                    let chunk = match self.with_errors(chunk.as_ref()) {
                        Some(rewritten) => B::from(rewritten),
                        None => chunk,
                    };
                    return Poll::Ready(Some(Ok(chunk)));
                }
                Poll::Ready(Some(Err(error))) => {
                    self.ended = true;
                    return Poll::Ready(Some(Err(error.into())));
                }
                Poll::Ready(None) => {
                    self.body_ended = true;
                    // A character the body ended in the middle of.
                    let mut last = match self.split_char.is_empty() {
                        true => Vec::new(),
                        false => REPLACEMENT.to_vec(),
                    };
                    self.split_char.clear();
                    // An error line the body ended in, without its line break: its chunk comes before the end.
                    if let Some(event) = self.error_event() {
                        self.line.clear();
                        last.push(b'\n');
                        last.extend_from_slice(&event);
                    }
                    if !last.is_empty() {
                        return Poll::Ready(Some(Ok(B::from(last))));
                    }
                }
            }
        }
        self.ended = true;
        match self.done {
            true => Poll::Ready(None),
            false => Poll::Ready(Some(Err(Box::new(CutShort)))),
        }
    }
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt;

    use super::*;

    fn ends(chunks: &[&'static str]) -> Vec<Result<String, String>> {
        let body =
            futures_util::stream::iter(chunks.iter().map(|chunk| Ok::<_, std::io::Error>(chunk.as_bytes().to_vec())));
        let watched = DoneWatch::new(body);
        let runtime = tokio::runtime::Builder::new_current_thread().build().expect("a runtime");
        runtime.block_on(
            watched
                .map(|item| item.map(|bytes| String::from_utf8_lossy(&bytes).into_owned()).map_err(|e| e.to_string()))
                .collect(),
        )
    }

    #[test]
    fn a_body_that_says_done_ends_as_it_is_and_one_that_does_not_ends_with_an_error() {
        assert_eq!(
            ends(&["data: {}\n\n", "data: [DONE]\n\n"]),
            [Ok("data: {}\n\n".into()), Ok("data: [DONE]\n\n".into())]
        );
        // Split across chunks, and without the space.
        assert_eq!(ends(&["data: {}\n\ndata:[DO", "NE]\n\n"]).len(), 2);
        assert_eq!(ends(&["data: [DONE]\n\n"]).len(), 1, "at the body's start");
        // The words inside an answer's text are not its end.
        let quoted = ends(&["data: {\"content\":\"data: [DONE]\"}\n\n"]);
        assert_eq!(quoted.last(), Some(&Err(CutShort.to_string())));
        let cut = ends(&["data: {\"choices\":[]}\n\n"]);
        assert_eq!(cut.len(), 2);
        assert_eq!(cut[1], Err(CutShort.to_string()));
    }

    /// What comes of `chunks`: each chunk's length, or the error.
    fn lengths(chunks: Vec<Vec<u8>>) -> Vec<Result<usize, String>> {
        let watched = DoneWatch::new(futures_util::stream::iter(chunks.into_iter().map(Ok::<_, std::io::Error>)));
        let runtime = tokio::runtime::Builder::new_current_thread().build().expect("a runtime");
        runtime
            .block_on(watched.map(|item| item.map(|bytes: Vec<u8>| bytes.len()).map_err(|e| e.to_string())).collect())
    }

    #[test]
    fn an_event_streamed_without_end_stops_the_answer_at_the_event_limit_and_many_events_do_not() {
        let megabyte = vec![b'a'; 1 << 20];
        let endless: Vec<Vec<u8>> = std::iter::once(b"data: ".to_vec()).chain(vec![megabyte.clone(); 17]).collect();
        let read = lengths(endless);
        assert_eq!(read.last(), Some(&Err(EventTooLong.to_string())), "{:?}", read.len());
        assert_eq!(read.len(), 17, "stopped at the chunk that passed the limit, not read on");

        // As much in events that end (a blank line, `\r\n` ones too): all of it is read.
        let mut event = b"data: ".to_vec();
        event.extend_from_slice(&megabyte);
        event.extend_from_slice(b"\r\n\r\n");
        let read = lengths(vec![event; 17]);
        assert_eq!(read.len(), 18);
        assert_eq!(read.last(), Some(&Err(CutShort.to_string())), "the body's own end, not the limit");
    }

    #[test]
    fn an_error_line_outside_the_data_lines_is_handed_on_as_an_error_chunk_right_after_it() {
        // As llama.cpp's server sends it, split across chunks, then closing without `[DONE]`.
        let ended = ends(&["data: {}\n\ner", "ror: {\"code\":500,\"message\":\"the co", "ntext is full\"}\n\n"]);
        let error = "\ndata: {\"error\":{\"code\":500,\"message\":\"the context is full\"}}\n\n";
        assert_eq!(ended[2], Ok(format!("ntext is full\"}}\n{error}\n")), "{ended:#?}");
        assert_eq!(ended.last(), Some(&Err(CutShort.to_string())));
        // Not JSON, and without its line break at the body's end.
        let ended = ends(&["data: {}\n\nerror: out of memory"]);
        assert_eq!(ended[1], Ok("\n\ndata: {\"error\":\"out of memory\"}\n\n".to_string()), "{ended:#?}");
        // The words at a line's start inside a data line, or a line that only starts alike, are not one.
        let ended = ends(&["data: error: {}\n\nerrors: 1\n\n", "data: [DONE]\n\n"]);
        assert_eq!(ended, [Ok("data: error: {}\n\nerrors: 1\n\n".into()), Ok("data: [DONE]\n\n".into())]);
    }

    #[test]
    fn a_byte_that_is_not_utf8_reads_as_a_replacement_and_a_split_character_is_joined() {
        let body = futures_util::stream::iter(
            [&b"data: {\"c\":\"\xE2\x82"[..], b"\xAC and \xFF\xFE\"}\n\ndata: [DONE]\n\n\xF0\x9F"]
                .map(|chunk| Ok::<_, std::io::Error>(chunk.to_vec())),
        );
        let runtime = tokio::runtime::Builder::new_current_thread().build().expect("a runtime");
        let read: Vec<Vec<u8>> = runtime.block_on(DoneWatch::new(body).map(|item| item.expect("no error")).collect());
        let chunks: Vec<&str> =
            read.iter().map(|bytes| std::str::from_utf8(bytes).expect("each chunk UTF-8")).collect();
        assert_eq!(
            chunks,
            ["data: {\"c\":\"", "\u{20AC} and \u{FFFD}\u{FFFD}\"}\n\ndata: [DONE]\n\n", "\u{FFFD}"],
            "the euro sign joined across chunks, each bad byte replaced, the character cut at the end replaced"
        );
        // Already valid: passed on as it is.
        let mut watch = DoneWatch::<futures_util::stream::Empty<Result<Vec<u8>, std::io::Error>>>::new(
            futures_util::stream::empty(),
        );
        assert_eq!(watch.valid_utf8("data: ä\n".as_bytes()), None);
    }
}
