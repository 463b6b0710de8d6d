//! How a server spawns its tasks: a provider the product leaves unset and a measurement sets.
//!
//! The lab charges what a receiver allocates to an account (decision U14); it does so by
//! wrapping the server's tasks and the QUIC drivers' runtime. The product only offers the
//! hook: unset, a spawn is `tokio::spawn` and the drivers run on quinn's tokio runtime
//! (decision W1).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// A task, boxed, as a provider receives and returns it.
pub type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Wraps the tasks a server spawns and supplies the runtime of its QUIC drivers.
pub trait TaskProvider: Send + Sync + fmt::Debug {
    /// Held while the server's first task (its accept loop) is made and spawned, and dropped
    /// after: what is allocated meanwhile belongs to it. The task itself then goes through
    /// [`TaskProvider::child`], as the tasks it spawns do.
    fn root_scope(&self) -> Box<dyn std::any::Any>;
    /// A task spawned by one of the server's tasks, wrapped (called on the spawning task).
    fn child(&self, task: Task) -> Task;
    /// The runtime of the server endpoint's driver and its connections' drivers.
    fn runtime(&self) -> Arc<dyn quinn::Runtime>;
}

/// The server's [`TaskProvider`], if any: cloned into every place that spawns.
#[derive(Clone, Default)]
pub struct Tasks(Option<Arc<dyn TaskProvider>>);

impl Tasks {
    /// Spawn through `provider`.
    pub fn provided(provider: Arc<dyn TaskProvider>) -> Tasks {
        Tasks(Some(provider))
    }

    /// Spawn the server's first task.
    pub fn spawn_root<F>(&self, task: F) -> tokio::task::JoinHandle<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        match &self.0 {
            None => tokio::spawn(task),
            Some(p) => {
                let _scope = p.root_scope();
                tokio::spawn(p.child(Box::pin(task)))
            }
        }
    }

    /// Spawn a task from one of the server's tasks.
    pub fn spawn<F>(&self, task: F) -> tokio::task::JoinHandle<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        match &self.0 {
            None => tokio::spawn(task),
            Some(p) => tokio::spawn(p.child(Box::pin(task))),
        }
    }

    /// The QUIC drivers' runtime: the provider's, else quinn's tokio runtime.
    pub fn runtime(&self) -> Arc<dyn quinn::Runtime> {
        match &self.0 {
            None => Arc::new(quinn::TokioRuntime),
            Some(p) => p.runtime(),
        }
    }
}

/// The same provider (or none on both sides), as `TransportOptions` compares its hooks.
impl PartialEq for Tasks {
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl fmt::Debug for Tasks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            None => f.write_str("Tasks(tokio)"),
            Some(p) => write!(f, "Tasks({p:?})"),
        }
    }
}
