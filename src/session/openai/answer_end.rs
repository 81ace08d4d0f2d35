//! Whether a streamed answer reached its end. `async-openai` ends the stream alike at `data: [DONE]` and when the
//! connection closes before it, so an answer cut short (a proxy or a crashed server closing the body mid-answer)
//! would read as a whole one: half a sentence as the turn's end, the first of two tool calls run and the second
//! lost. The body is watched on its way to the client: if it ends without `data: [DONE]`, the stream ends with an
//! error, which fails the turn unless its answer had already said how it finished (a `finish_reason`: some
//! servers send no `[DONE]`).

use std::error::Error;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::Stream;

/// The end marker, as servers send it (with or without the space), at the start of a line: not the same words
/// inside an answer's text (which is JSON in a `data:` line of its own).
const MARKERS: [&[u8]; 2] = [b"\ndata: [DONE]", b"\ndata:[DONE]"];
/// Enough of the previous chunk to find a marker split across two.
const CARRY: usize = 16;

/// The answer's body, passed on as it is, with an error at its end if it never said `data: [DONE]`.
pub(crate) struct DoneWatch<S> {
    body: S,
    /// The end of the previous chunk.
    tail: Vec<u8>,
    done: bool,
    ended: bool,
}

impl<S> DoneWatch<S> {
    pub(crate) fn new(body: S) -> Self {
        // The body's start is a line's start.
        Self { body, tail: b"\n".to_vec(), done: false, ended: false }
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
}

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
    B: AsRef<[u8]>,
    E: Into<Box<dyn Error + Send + Sync>>,
{
    type Item = Result<B, Box<dyn Error + Send + Sync>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.ended {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.body).poll_next(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Ok(chunk))) => {
                self.scan(chunk.as_ref());
                Poll::Ready(Some(Ok(chunk)))
            }
            Poll::Ready(Some(Err(error))) => {
                self.ended = true;
                Poll::Ready(Some(Err(error.into())))
            }
            Poll::Ready(None) => {
                self.ended = true;
                match self.done {
                    true => Poll::Ready(None),
                    false => Poll::Ready(Some(Err(Box::new(CutShort)))),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt;

    use super::*;

    fn ends(chunks: &[&'static str]) -> Vec<Result<String, String>> {
        let body = futures_util::stream::iter(chunks.iter().map(|chunk| Ok::<_, std::io::Error>(chunk.as_bytes())));
        let watched = DoneWatch::new(body);
        let runtime = tokio::runtime::Builder::new_current_thread().build().expect("a runtime");
        runtime.block_on(
            watched
                .map(|item| item.map(|bytes| String::from_utf8_lossy(bytes).into_owned()).map_err(|e| e.to_string()))
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
}
