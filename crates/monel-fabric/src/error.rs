//! The planner's errors: a plan that cannot be made, and a design file's mistakes.

use std::fmt;

use crate::engine::event::ReplayError;
use crate::topology::TopologyError;

/// Why a plan cannot be made.
#[derive(Debug, Clone, PartialEq)]
pub enum PlanError {
    /// A bad request; names the field.
    Invalid {
        /// The field.
        field: &'static str,
        /// Why.
        why: String,
    },
    /// The replay failed.
    Replay(ReplayError),
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Invalid { field, why } => write!(f, "{field}: {why}"),
            Self::Replay(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for PlanError {}

impl From<ReplayError> for PlanError {
    fn from(e: ReplayError) -> Self {
        Self::Replay(e)
    }
}

pub(crate) fn invalid(field: &'static str, why: impl Into<String>) -> PlanError {
    PlanError::Invalid {
        field,
        why: why.into(),
    }
}

/// A configuration mistake: the field (dotted path) and what is wrong or allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Dotted path of the field, e.g. `fabric.link_speed`.
    pub field: String,
    /// What is wrong and what is allowed.
    pub why: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.why)
    }
}

impl std::error::Error for ConfigError {}

pub(crate) fn err(field: impl Into<String>, why: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        why: why.into(),
    }
}

impl From<TopologyError> for ConfigError {
    fn from(e: TopologyError) -> Self {
        err(format!("fabric.{}", e.field), e.why)
    }
}

impl From<PlanError> for ConfigError {
    fn from(e: PlanError) -> Self {
        match e {
            PlanError::Invalid { field, why } => err(format!("collective.{field}"), why),
            PlanError::Replay(r) => err("collective", r.to_string()),
        }
    }
}
