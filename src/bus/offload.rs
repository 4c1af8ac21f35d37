//! Calls whose answers grow with the number of objects (the listings) are
//! answered on a runtime of their own, the lists runtime, so that building
//! and serialising them never holds the thread the service loop and the
//! bus share.
//!
//! The daemon runs on one thread (a current-thread runtime): a call, its
//! change, its commit and its reply cost no hand-over between threads
//! (docs/benchmarks.md, #25). A listing of 100,000 workers takes seconds to
//! build and tens of MB to serialise; zbus serialises a method's reply in
//! the task that ran it. [`Offloaded`] wraps an interface and runs the named
//! methods, reply included, as a task on the lists runtime.

use std::collections::HashMap;
use std::fmt::Write;
use std::sync::Arc;
use zbus::export::async_trait::async_trait;
use zbus::message::{Header, Message};
use zbus::names::{InterfaceName, MemberName};
use zbus::object_server::{DispatchResult, Interface, SignalEmitter};
use zbus::{fdo, BoxDBusError, Connection, ObjectServer, OwnedVariant, Variant};

/// Where listings are built: a handle on the lists runtime.
pub type Lists = tokio::runtime::Handle;

/// `I`, with the calls in `methods` run on the lists runtime.
pub struct Offloaded<I> {
    inner: Arc<I>,
    methods: &'static [&'static str],
    lists: Lists,
}

impl<I> Offloaded<I> {
    pub fn new(inner: I, methods: &'static [&'static str], lists: Lists) -> Offloaded<I> {
        Offloaded {
            inner: Arc::new(inner),
            methods,
            lists,
        }
    }
}

#[async_trait]
impl<I: Interface> Interface for Offloaded<I> {
    fn name() -> InterfaceName<'static> {
        I::name()
    }

    fn spawn_tasks_for_methods(&self) -> bool {
        self.inner.spawn_tasks_for_methods()
    }

    async fn get(
        &self,
        property_name: &str,
        server: &ObjectServer,
        connection: &Connection,
        header: Option<&Header<'_>>,
        emitter: &SignalEmitter<'_>,
    ) -> Option<Result<OwnedVariant, BoxDBusError>> {
        self.inner
            .get(property_name, server, connection, header, emitter)
            .await
    }

    async fn get_all(
        &self,
        server: &ObjectServer,
        connection: &Connection,
        header: Option<&Header<'_>>,
        emitter: &SignalEmitter<'_>,
    ) -> fdo::Result<HashMap<String, OwnedVariant>> {
        self.inner
            .get_all(server, connection, header, emitter)
            .await
    }

    fn set<'call>(
        &'call self,
        property_name: &'call str,
        value: &'call Variant<'_>,
        server: &'call ObjectServer,
        connection: &'call Connection,
        header: Option<&'call Header<'_>>,
        emitter: &'call SignalEmitter<'_>,
    ) -> DispatchResult<'call> {
        self.inner
            .set(property_name, value, server, connection, header, emitter)
    }

    /// The listings' interfaces have no writable property held mutably.
    async fn set_mut(
        &mut self,
        _property_name: &str,
        _value: &Variant<'_>,
        _server: &ObjectServer,
        _connection: &Connection,
        _header: Option<&Header<'_>>,
        _emitter: &SignalEmitter<'_>,
    ) -> Option<Result<(), BoxDBusError>> {
        None
    }

    fn call<'call>(
        &'call self,
        server: &'call ObjectServer,
        connection: &'call Connection,
        msg: &'call Message,
        name: MemberName<'call>,
    ) -> DispatchResult<'call> {
        if !self.methods.contains(&name.as_str()) {
            return self.inner.call(server, connection, msg, name);
        }
        let (inner, server, conn, msg) = (
            self.inner.clone(),
            server.clone(),
            connection.clone(),
            msg.clone(),
        );
        let name = name.to_owned();
        // The whole call, its reply's serialisation and sending included,
        // runs there; this thread only waits for it to end.
        let task = self.lists.spawn(async move {
            match inner.call(&server, &conn, &msg, name.as_ref()) {
                DispatchResult::Async(f) => f.await,
                _ => Err(Box::new(fdo::Error::UnknownMethod(format!("{name}"))) as BoxDBusError),
            }
        });
        DispatchResult::Async(Box::pin(async move {
            task.await.unwrap_or_else(|e| {
                Err(Box::new(fdo::Error::Failed(format!("listing: {e}"))) as BoxDBusError)
            })
        }))
    }

    fn call_mut<'call>(
        &'call mut self,
        server: &'call ObjectServer,
        connection: &'call Connection,
        msg: &'call Message,
        name: MemberName<'call>,
    ) -> DispatchResult<'call> {
        self.call(server, connection, msg, name)
    }

    fn introspect_to_writer(&self, writer: &mut dyn Write, level: usize) {
        self.inner.introspect_to_writer(writer, level)
    }
}
