//! Sockets opened inside a session's network namespace. A thread's network
//! namespace is where the sockets it creates live, for their whole life: one
//! long-lived thread of its own enters a session's namespace, creates an
//! unconnected socket there and hands it back; connecting it is the async
//! runtime's work. No other thread of the runner ever leaves the runner's
//! own namespace.

use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex, OnceLock};

use nix::sched::{CloneFlags, setns};
use runner_core::reach::SocketOpener;
use runner_core::sync::lock;
use tokio::net::TcpSocket;
use tokio::sync::oneshot;

type Job = Box<dyn FnOnce() + Send>;

/// The thread that enters namespaces; every job sets its namespace first,
/// so whichever it was left in never matters.
fn opener_thread() -> io::Result<&'static Sender<Job>> {
    static THREAD: OnceLock<Result<Sender<Job>, String>> = OnceLock::new();
    THREAD
        .get_or_init(|| {
            let (jobs, queue) = channel::<Job>();
            std::thread::Builder::new()
                .name("netns-sockets".to_owned())
                .spawn(move || {
                    for job in queue {
                        job();
                    }
                })
                .map(|_| jobs)
                .map_err(|err| err.to_string())
        })
        .as_ref()
        .map_err(|err| io::Error::other(format!("no thread to open namespace sockets: {err}")))
}

/// Opens sockets in one namespace until it is closed.
pub(crate) struct NamespaceSockets {
    id: u64,
    /// The namespace, held open; `None` once the session let it go.
    namespace: Mutex<Option<Arc<File>>>,
}

impl NamespaceSockets {
    pub(crate) fn new(namespace: File) -> Self {
        static IDS: AtomicU64 = AtomicU64::new(1);
        Self {
            id: IDS.fetch_add(1, Ordering::Relaxed),
            namespace: Mutex::new(Some(Arc::new(namespace))),
        }
    }

    /// No socket is opened in the namespace any more (those open stay).
    pub(crate) fn close(&self) {
        lock(&self.namespace).take();
    }

    /// A socket bound to an ephemeral loopback port of the namespace: a
    /// port free there a moment ago.
    pub(crate) async fn free_loopback_port(&self) -> io::Result<u16> {
        let socket = self.open().await?;
        socket.bind((std::net::Ipv4Addr::LOCALHOST, 0).into())?;
        Ok(socket.local_addr()?.port())
    }
}

#[async_trait::async_trait]
impl SocketOpener for NamespaceSockets {
    async fn open(&self) -> io::Result<TcpSocket> {
        let namespace = lock(&self.namespace).clone().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::ConnectionRefused,
                "the session's network is gone",
            )
        })?;
        let (reply, socket) = oneshot::channel();
        opener_thread()?
            .send(Box::new(move || {
                let opened = setns(&*namespace, CloneFlags::CLONE_NEWNET)
                    .map_err(io::Error::from)
                    .and_then(|()| TcpSocket::new_v4());
                let _ = reply.send(opened);
            }))
            .map_err(|_| io::Error::other("the thread that opens namespace sockets is gone"))?;
        socket
            .await
            .map_err(|_| io::Error::other("the thread that opens namespace sockets is gone"))?
    }

    fn id(&self) -> u64 {
        self.id
    }
}
