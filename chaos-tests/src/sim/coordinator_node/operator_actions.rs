//! An operator's actions as the coordinator takes them (`Core::resolve`,
//! `Core::clear_behind`): one audit record at a time, appended forced and applied once durable.

use coordinator::records::LogRecord;
use protocol::{Decision, GlobalTxId, TxId};

use protocol::operator::{AuditAction, AuditEntry};

use super::CoordinatorNode;
use crate::sim::io::Io;

impl CoordinatorNode {
    /// An operator resolves an attempt (after the judge allowed it, or not, under a
    /// mutation): the audit record is appended forced and applied once durable, as
    /// `Core::resolve` does. One at a time; `false` when it cannot act now.
    pub fn operator_resolve(
        &mut self,
        io: &mut Io,
        txid: TxId,
        gtid: GlobalTxId,
        decision: Decision,
        evidence: protocol::operator::Evidence,
    ) -> bool {
        self.operator_act(
            io,
            "in doubt after a restore",
            AuditAction::Resolve {
                id: txid,
                gtid,
                decision,
                evidence,
            },
        )
    }

    /// An operator clears the behind mark, as `Core::clear_behind` does; `false` when it
    /// cannot act now or there is no mark.
    pub fn operator_clear_behind(&mut self, io: &mut Io) -> bool {
        let Some(cleared) = self
            .engine
            .as_ref()
            .and_then(|e| e.behind())
            .map(|b| b.evidence.clone())
        else {
            return false;
        };
        self.operator_act(
            io,
            "the restore's loss is accepted",
            AuditAction::ClearBehind { cleared },
        )
    }

    fn operator_act(&mut self, io: &mut Io, reason: &str, action: AuditAction) -> bool {
        let Some(engine) = &self.engine else {
            return false;
        };
        if !self.audit_waits.is_empty() {
            return false;
        }
        let entry = AuditEntry {
            seq: engine.next_audit_seq(),
            at_ms: io.now_ms,
            operator: "sim-operator".into(),
            reason: reason.into(),
            action,
        };
        io.note(|| format!("operator acts: {:?}", entry.action));
        let seq = self.disk.append(LogRecord::Audit(entry.clone()));
        self.audit_waits.push((seq, entry));
        self.schedule_sync(io);
        true
    }
}
