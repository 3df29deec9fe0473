//! The connections a server holds: how many, which of them have not sent a
//! byte yet (the ones shed at the limit, oldest first), and how many each
//! client address holds.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::mem::MaybeUninit;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, ready};

use socket2::SockRef;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// Why a connection was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refused {
    /// Every slot is held by a connection that has sent something.
    Full,
    /// Its client holds its share already.
    ClientFull,
}

/// The open connections of one server.
pub(super) struct Table {
    limit: usize,
    per_client: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    next_id: u64,
    open: HashMap<u64, Member>,
    /// The connections that have not sent a byte, by age (ids grow).
    idle: BTreeMap<u64, Arc<TcpStream>>,
    clients: HashMap<IpAddr, usize>,
    shed: u64,
}

struct Member {
    client: Option<IpAddr>,
    shed: CancellationToken,
}

impl Inner {
    fn count(&mut self, client: Option<IpAddr>) {
        if let Some(client) = client {
            *self.clients.entry(client).or_default() += 1;
        }
    }

    fn uncount(&mut self, client: Option<IpAddr>) {
        if let Some(client) = client
            && let Some(held) = self.clients.get_mut(&client)
        {
            *held -= 1;
            if *held == 0 {
                self.clients.remove(&client);
            }
        }
    }

    fn held_by(&self, client: IpAddr) -> usize {
        self.clients.get(&client).copied().unwrap_or_default()
    }

    /// Closes the oldest connection that has sent nothing; `false` when
    /// there is none. A connection whose bytes wait unread in the socket has
    /// sent something: it is passed over (and no longer idle).
    fn shed_oldest_idle(&mut self) -> bool {
        while let Some((id, tcp)) = self.idle.pop_first() {
            if has_unread_bytes(&tcp) {
                continue;
            }
            if let Some(member) = self.open.remove(&id) {
                self.uncount(member.client);
                member.shed.cancel();
                self.shed += 1;
                return true;
            }
        }
        false
    }
}

/// Whether the peer has sent bytes the server has not read yet.
fn has_unread_bytes(tcp: &TcpStream) -> bool {
    let mut byte = [MaybeUninit::<u8>::uninit()];
    // The socket is non-blocking: an idle one answers "would block".
    matches!(SockRef::from(tcp).peek(&mut byte), Ok(n) if n > 0)
}

impl Table {
    pub(super) fn new(limit: usize, per_client: usize) -> Arc<Self> {
        Arc::new(Self {
            limit,
            per_client,
            inner: Mutex::new(Inner::default()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Connections shed so far.
    pub(super) fn shed_count(&self) -> u64 {
        self.lock().shed
    }

    /// Admits `tcp` from `client` (`None`: a trusted proxy, whose requests
    /// are counted against their clients as they come), shedding the oldest
    /// idle connection when every slot is taken.
    pub(super) fn admit(
        self: &Arc<Self>,
        tcp: &Arc<TcpStream>,
        client: Option<IpAddr>,
    ) -> Result<Arc<Ticket>, Refused> {
        let mut inner = self.lock();
        if let Some(client) = client
            && inner.held_by(client) >= self.per_client
        {
            return Err(Refused::ClientFull);
        }
        let full = inner.open.len() >= self.limit;
        if full && !inner.shed_oldest_idle() {
            return Err(Refused::Full);
        }
        let id = inner.next_id;
        inner.next_id += 1;
        let shed = CancellationToken::new();
        inner.open.insert(
            id,
            Member {
                client,
                shed: shed.clone(),
            },
        );
        inner.idle.insert(id, tcp.clone());
        inner.count(client);
        Ok(Arc::new(Ticket {
            table: self.clone(),
            id,
            shed,
            shed_another: full,
        }))
    }
}

/// One admitted connection's place in the [`Table`], given back when the
/// last of its holders (the connection, its upgraded stream) lets go.
pub(super) struct Ticket {
    table: Arc<Table>,
    id: u64,
    shed: CancellationToken,
    /// Another connection was shed to admit this one.
    shed_another: bool,
}

impl Ticket {
    /// Whether another connection was shed to admit this one.
    pub(super) fn shed_another(&self) -> bool {
        self.shed_another
    }

    /// Fires when the connection was shed to admit another.
    pub(super) fn shed(&self) -> &CancellationToken {
        &self.shed
    }

    /// The connection has sent a byte: it is never shed.
    fn sent(&self) {
        self.table.lock().idle.remove(&self.id);
    }

    /// Counts the connection against `client` from now on (a trusted
    /// proxy's connection carries one client's request, then maybe
    /// another's); refused when `client` holds its share already.
    pub(super) fn attribute(&self, client: IpAddr) -> Result<(), Refused> {
        let per_client = self.table.per_client;
        let mut inner = self.table.lock();
        let Some(member) = inner.open.get(&self.id) else {
            return Ok(());
        };
        let previous = member.client;
        if previous == Some(client) {
            return Ok(());
        }
        if inner.held_by(client) >= per_client {
            return Err(Refused::ClientFull);
        }
        inner.uncount(previous);
        inner.count(Some(client));
        if let Some(member) = inner.open.get_mut(&self.id) {
            member.client = Some(client);
        }
        Ok(())
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut inner = self.table.lock();
        inner.idle.remove(&self.id);
        if let Some(member) = inner.open.remove(&self.id) {
            inner.uncount(member.client);
        }
    }
}

/// An admitted connection's socket: tells its [`Ticket`] when the first
/// byte arrives, and holds the ticket for as long as the socket lives
/// (past an upgrade too).
pub(super) struct Watched {
    // Dropped before the socket, so that a peer that sees the connection
    // close finds its place given back.
    ticket: Arc<Ticket>,
    tcp: Arc<TcpStream>,
    sent: bool,
}

impl Watched {
    pub(super) fn new(tcp: Arc<TcpStream>, ticket: Arc<Ticket>) -> Self {
        Self {
            tcp,
            ticket,
            sent: false,
        }
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        // Once the table let go of the socket (its first byte came, or it
        // was never idle), the socket's own reads: they take the buffer
        // uninitialised and take a short read as the end of what is there,
        // without a read that would block to find out.
        if let Some(tcp) = Arc::get_mut(&mut this.tcp) {
            ready!(Pin::new(tcp).poll_read(cx, buf))?;
        } else {
            loop {
                ready!(this.tcp.poll_read_ready(cx))?;
                match this.tcp.try_read(buf.initialize_unfilled()) {
                    Ok(n) => {
                        buf.advance(n);
                        break;
                    }
                    Err(err) if err.kind() == io::ErrorKind::WouldBlock => {}
                    Err(err) => return Poll::Ready(Err(err)),
                }
            }
        }
        if !this.sent && buf.filled().len() > before {
            this.sent = true;
            this.ticket.sent();
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Some(tcp) = Arc::get_mut(&mut this.tcp) {
            return Pin::new(tcp).poll_write(cx, buf);
        }
        loop {
            ready!(this.tcp.poll_write_ready(cx))?;
            match this.tcp.try_write(buf) {
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => {}
                written => return Poll::Ready(written),
            }
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Some(tcp) = Arc::get_mut(&mut this.tcp) {
            return Pin::new(tcp).poll_write_vectored(cx, bufs);
        }
        loop {
            ready!(this.tcp.poll_write_ready(cx))?;
            match this.tcp.try_write_vectored(bufs) {
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => {}
                written => return Poll::Ready(written),
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(SockRef::from(&*self.tcp).shutdown(std::net::Shutdown::Write))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt as _;
    use tokio::net::TcpListener;

    /// A connected pair: the server's end (shared, as the table holds it)
    /// and the client's.
    async fn pair(listener: &TcpListener) -> (Arc<TcpStream>, TcpStream) {
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        (Arc::new(server), client)
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[tokio::test]
    async fn at_the_limit_the_oldest_silent_connection_is_shed() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let table = Table::new(2, 10);
        let (first, _c1) = pair(&listener).await;
        let (second, _c2) = pair(&listener).await;
        let (third, _c3) = pair(&listener).await;
        let a = table.admit(&first, Some(ip("192.0.2.1"))).unwrap();
        let b = table.admit(&second, Some(ip("192.0.2.1"))).unwrap();
        let c = table.admit(&third, Some(ip("192.0.2.2"))).unwrap();
        assert!(a.shed().is_cancelled());
        assert!(!b.shed().is_cancelled());
        assert!(!c.shed().is_cancelled());
        assert!(!a.shed_another() && !b.shed_another() && c.shed_another());
        assert_eq!(table.shed_count(), 1);
        // The shed one's count went with it.
        assert_eq!(table.lock().held_by(ip("192.0.2.1")), 1);
        drop(a);
        assert_eq!(table.lock().open.len(), 2);
    }

    #[tokio::test]
    async fn a_connection_that_sent_a_byte_is_never_shed() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let table = Table::new(2, 10);
        let (read, _c1) = pair(&listener).await;
        let (unread, mut c2) = pair(&listener).await;
        let (third, _c3) = pair(&listener).await;
        let a = table.admit(&read, None).unwrap();
        a.sent();
        let b = table.admit(&unread, None).unwrap();
        // Sent, not yet read by the server.
        c2.write_all(b"G").await.unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(10), unread.readable())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(table.admit(&third, None).err(), Some(Refused::Full));
        assert!(!a.shed().is_cancelled());
        assert!(!b.shed().is_cancelled());
        drop(b);
        assert!(table.admit(&third, None).is_ok());
    }

    #[tokio::test]
    async fn a_client_holds_its_share_and_no_more() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let table = Table::new(10, 2);
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(pair(&listener).await);
        }
        let one = ip("192.0.2.1");
        let a = table.admit(&held[0].0, Some(one)).unwrap();
        let _b = table.admit(&held[1].0, Some(one)).unwrap();
        assert_eq!(
            table.admit(&held[2].0, Some(one)).err(),
            Some(Refused::ClientFull)
        );
        drop(a);
        let proxied = table.admit(&held[2].0, None).unwrap();
        assert_eq!(proxied.attribute(one), Ok(()));
        assert_eq!(proxied.attribute(one), Ok(()));
        let (fourth, _c4) = pair(&listener).await;
        let other = table.admit(&fourth, None).unwrap();
        assert_eq!(other.attribute(one), Err(Refused::ClientFull));
        // Moving to another client gives the place back.
        assert_eq!(proxied.attribute(ip("192.0.2.2")), Ok(()));
        assert_eq!(other.attribute(one), Ok(()));
    }
}
