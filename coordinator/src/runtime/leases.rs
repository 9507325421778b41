//! The lease service's shell: steps the lease engine under its lock, submits its records to
//! the coordinator's log in that order (forced), and answers only once they are durable.

use std::sync::atomic::Ordering;

use protocol::lease::Lease;
use wal::{Durability, RecordType, WalError};

use crate::leases::{LeaseCommand, LeaseEvent, LeaseReply};
use crate::records::LogRecord;
use crate::runtime::Core;

impl Core {
    /// Steps the lease engine with the event `make` builds at the lease clock's now, and
    /// returns its reply once every record it logged is durable. A log failure is the error.
    pub async fn lease_step(
        &self,
        make: impl FnOnce(u64) -> LeaseEvent,
    ) -> Result<LeaseReply, WalError> {
        let mut tickets = Vec::new();
        let mut reply = None;
        {
            let mut engine = self.leases.lock();
            let commands = engine.step(make(self.leases.clock.now_ms()));
            for command in commands {
                match command {
                    LeaseCommand::Append(record) => {
                        let record = LogRecord::Lease(record);
                        // Submitted under the lease lock: the log's order is the engine's.
                        tickets.push(self.wal.submit(
                            RecordType(record.record_type()),
                            record.encode(),
                            Durability::Forced,
                        ));
                    }
                    LeaseCommand::Reply(r) => reply = Some(r),
                }
            }
        }
        let logged = !tickets.is_empty();
        for ticket in tickets {
            ticket.wait().await?;
        }
        if logged {
            crash_point!("coordinator::lease_logged_not_answered");
        }
        let reply = reply.ok_or(WalError::Closed)?;
        let counter = match &reply {
            LeaseReply::Granted(_) => &self.metrics.lease_grants,
            LeaseReply::Held { .. } | LeaseReply::Lost { .. } => &self.metrics.lease_refusals,
            LeaseReply::Released(_) => &self.metrics.lease_releases,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(reply)
    }

    /// The lease on `name`, if it holds now.
    pub fn lease(&self, name: &str) -> Option<Lease> {
        self.leases.lock().get(name, self.leases.clock.now_ms())
    }

    /// Every lease that holds now.
    pub fn leases(&self) -> Vec<Lease> {
        self.leases.lock().list(self.leases.clock.now_ms())
    }
}
