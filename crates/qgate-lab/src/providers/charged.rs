//! A server's tasks and QUIC drivers charged to an allocation account (decision U14).

use std::sync::Arc;

use qgate_tally::Account;
use qgate_transport::tasks::{Task, TaskProvider, Tasks};

/// Charges the QUIC drivers to the account and the server's own tasks to its parent (or to the
/// account itself when it has none): the parent then counts the whole receiver, the account
/// its QUIC stack alone.
#[derive(Debug)]
pub struct Charged(pub Account);

impl Charged {
    /// The transport's [`Tasks`] for `account`, or the product's when there is none (a test
    /// binary, whose allocator does not count).
    pub fn tasks(account: Option<&Account>) -> Tasks {
        match account {
            Some(a) => Tasks::provided(Arc::new(Charged(a.clone()))),
            None => Tasks::default(),
        }
    }
}

impl TaskProvider for Charged {
    fn root_scope(&self) -> Box<dyn std::any::Any> {
        Box::new(self.0.parent().unwrap_or(&self.0).enter())
    }

    fn child(&self, task: Task) -> Task {
        // Called on the spawning task: it carries that task's account on.
        Box::pin(qgate_tally::inherit(task))
    }

    fn runtime(&self) -> Arc<dyn quinn::Runtime> {
        Arc::new(CountedRuntime(self.0.clone()))
    }
}

/// quinn's tokio runtime, with what the endpoint's driver and its connections' drivers
/// allocate charged to an account.
#[derive(Debug)]
struct CountedRuntime(Account);

impl quinn::Runtime for CountedRuntime {
    fn new_timer(&self, i: std::time::Instant) -> std::pin::Pin<Box<dyn quinn::AsyncTimer>> {
        quinn::TokioRuntime.new_timer(i)
    }

    fn spawn(&self, future: Task) {
        quinn::TokioRuntime.spawn(Box::pin(self.0.counted(future)))
    }

    fn wrap_udp_socket(
        &self,
        t: std::net::UdpSocket,
    ) -> std::io::Result<Arc<dyn quinn::AsyncUdpSocket>> {
        quinn::TokioRuntime.wrap_udp_socket(t)
    }

    // quinn's clock through tokio's (virtual in a simulation), as `TokioRuntime` reads it.
    fn now(&self) -> std::time::Instant {
        quinn::TokioRuntime.now()
    }
}
