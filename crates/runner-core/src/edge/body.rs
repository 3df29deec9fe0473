//! The request body the edge sends upstream (to a session's app, or to a
//! peer replica): it says when it has been sent, which starts the wait for
//! the response's head.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use tokio::sync::oneshot;

/// The client's request body on its way upstream; says when it has been
/// sent (or dropped), which starts the response-header timeout.
pub(crate) struct RequestBody<B = Incoming> {
    inner: B,
    sent: Option<oneshot::Sender<()>>,
}

impl<B: HttpBody> RequestBody<B> {
    /// `inner` on its way upstream, and what fires once it has been sent:
    /// `None` when there is nothing to send (the wait for the response's
    /// head starts at once).
    pub(crate) fn new(inner: B) -> (Self, Option<oneshot::Receiver<()>>) {
        if inner.is_end_stream() {
            return (Self { inner, sent: None }, None);
        }
        let (sent, sent_rx) = oneshot::channel();
        (
            Self {
                inner,
                sent: Some(sent),
            },
            Some(sent_rx),
        )
    }

    fn done(&mut self) {
        if let Some(sent) = self.sent.take() {
            let _ = sent.send(());
        }
    }
}

impl<B: HttpBody<Data = Bytes> + Unpin> HttpBody for RequestBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) {
            self.done();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
