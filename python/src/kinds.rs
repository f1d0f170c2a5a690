//! The native API's enums: which collective, which element type, which reduction. The
//! Python package maps its names ("all_reduce", "float32", "sum") onto these once, at its
//! edge; the native calls take nothing else.

// Members are named as Python's enums name theirs: in capitals.
#![allow(non_camel_case_types, clippy::upper_case_acronyms)]

use monel_ccl::{CollectiveKind, DataType, RedOp};
use pyo3::prelude::*;

/// A collective (`monel_ccl::CollectiveKind`).
#[pyclass(module = "monel._monel", name = "Coll", eq, eq_int, frozen, hash)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Coll {
    ALL_REDUCE,
    BROADCAST,
    REDUCE,
    ALL_GATHER,
    REDUCE_SCATTER,
    ALL_TO_ALL,
    GATHER,
    SCATTER,
    BARRIER,
}

impl From<Coll> for CollectiveKind {
    fn from(c: Coll) -> Self {
        match c {
            Coll::ALL_REDUCE => Self::AllReduce,
            Coll::BROADCAST => Self::Broadcast,
            Coll::REDUCE => Self::Reduce,
            Coll::ALL_GATHER => Self::AllGather,
            Coll::REDUCE_SCATTER => Self::ReduceScatter,
            Coll::ALL_TO_ALL => Self::AllToAll,
            Coll::GATHER => Self::Gather,
            Coll::SCATTER => Self::Scatter,
            Coll::BARRIER => Self::Barrier,
        }
    }
}

#[pymethods]
impl Coll {
    fn __str__(&self) -> &'static str {
        CollectiveKind::from(*self).name()
    }
}

/// An element type (`monel_ccl::DataType`).
#[pyclass(module = "monel._monel", name = "DType", eq, eq_int, frozen, hash)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum DType {
    INT8,
    UINT8,
    INT32,
    UINT32,
    INT64,
    UINT64,
    FLOAT16,
    BFLOAT16,
    FLOAT32,
    FLOAT64,
    FLOAT8E4M3,
    FLOAT8E5M2,
}

impl From<DType> for DataType {
    fn from(d: DType) -> Self {
        match d {
            DType::INT8 => Self::I8,
            DType::UINT8 => Self::U8,
            DType::INT32 => Self::I32,
            DType::UINT32 => Self::U32,
            DType::INT64 => Self::I64,
            DType::UINT64 => Self::U64,
            DType::FLOAT16 => Self::F16,
            DType::BFLOAT16 => Self::Bf16,
            DType::FLOAT32 => Self::F32,
            DType::FLOAT64 => Self::F64,
            DType::FLOAT8E4M3 => Self::F8E4M3,
            DType::FLOAT8E5M2 => Self::F8E5M2,
        }
    }
}

#[pymethods]
impl DType {
    /// The package's name for the type: the member's name in lower case (`float32`).
    fn __str__(&self) -> &'static str {
        match self {
            Self::INT8 => "int8",
            Self::UINT8 => "uint8",
            Self::INT32 => "int32",
            Self::UINT32 => "uint32",
            Self::INT64 => "int64",
            Self::UINT64 => "uint64",
            Self::FLOAT16 => "float16",
            Self::BFLOAT16 => "bfloat16",
            Self::FLOAT32 => "float32",
            Self::FLOAT64 => "float64",
            Self::FLOAT8E4M3 => "float8e4m3",
            Self::FLOAT8E5M2 => "float8e5m2",
        }
    }
}

/// A reduction (`monel_ccl::RedOp`).
#[pyclass(module = "monel._monel", name = "RedOp", eq, eq_int, frozen, hash)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum ROp {
    SUM,
    PROD,
    MIN,
    MAX,
    AVG,
}

impl From<ROp> for RedOp {
    fn from(o: ROp) -> Self {
        match o {
            ROp::SUM => Self::Sum,
            ROp::PROD => Self::Prod,
            ROp::MIN => Self::Min,
            ROp::MAX => Self::Max,
            ROp::AVG => Self::Avg,
        }
    }
}

#[pymethods]
impl ROp {
    fn __str__(&self) -> &'static str {
        RedOp::from(*self).name()
    }
}

/// Adds the enums to the native module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Coll>()?;
    m.add_class::<DType>()?;
    m.add_class::<ROp>()?;
    Ok(())
}
