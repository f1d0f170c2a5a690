//! Element types and reduction operators (NCCL's `ncclDataType_t` and `ncclRedOp_t`).

use std::fmt;

/// An element type. Values are little-endian in memory, as on every host Monel runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DataType {
    /// `ncclInt8`.
    I8,
    /// `ncclUint8`.
    U8,
    /// `ncclInt32`.
    I32,
    /// `ncclUint32`.
    U32,
    /// `ncclInt64`.
    I64,
    /// `ncclUint64`.
    U64,
    /// `ncclFloat16` (IEEE half); reduced in f32.
    F16,
    /// `ncclBfloat16`; reduced in f32.
    Bf16,
    /// `ncclFloat32`.
    F32,
    /// `ncclFloat64`.
    F64,
    /// `ncclFloat8e4m3`: OCP FP8 E4M3 (bias 7, no infinities, max 448); reduced in f32,
    /// rounded to nearest even, saturating at the largest finite value.
    F8E4M3,
    /// `ncclFloat8e5m2`: OCP FP8 E5M2 (bias 15, max 57344); as E4M3.
    F8E5M2,
}

impl DataType {
    /// Every type, in NCCL's order.
    pub const ALL: [Self; 12] = [
        Self::I8,
        Self::U8,
        Self::I32,
        Self::U32,
        Self::I64,
        Self::U64,
        Self::F16,
        Self::F32,
        Self::F64,
        Self::Bf16,
        Self::F8E4M3,
        Self::F8E5M2,
    ];

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            Self::I8 | Self::U8 | Self::F8E4M3 | Self::F8E5M2 => 1,
            Self::F16 | Self::Bf16 => 2,
            Self::I32 | Self::U32 | Self::F32 => 4,
            Self::I64 | Self::U64 | Self::F64 => 8,
        }
    }

    /// The name nccl-tests prints (`float`, `half`, `bfloat16`, `int32`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Self::I8 => "int8",
            Self::U8 => "uint8",
            Self::I32 => "int32",
            Self::U32 => "uint32",
            Self::I64 => "int64",
            Self::U64 => "uint64",
            Self::F16 => "half",
            Self::Bf16 => "bfloat16",
            Self::F32 => "float",
            Self::F64 => "double",
            Self::F8E4M3 => "float8e4m3",
            Self::F8E5M2 => "float8e5m2",
        }
    }

    /// True for the floating-point types.
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            Self::F16 | Self::Bf16 | Self::F32 | Self::F64 | Self::F8E4M3 | Self::F8E5M2
        )
    }

    /// Parses nccl-tests' and PyTorch's names (`float`, `float32`, `f32`, `half`, `bf16`, ...).
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s.to_ascii_lowercase().as_str() {
            "int8" | "i8" | "char" => Self::I8,
            "uint8" | "u8" => Self::U8,
            "int32" | "i32" | "int" => Self::I32,
            "uint32" | "u32" => Self::U32,
            "int64" | "i64" => Self::I64,
            "uint64" | "u64" => Self::U64,
            "half" | "float16" | "f16" => Self::F16,
            "bfloat16" | "bf16" => Self::Bf16,
            "float" | "float32" | "f32" => Self::F32,
            "double" | "float64" | "f64" => Self::F64,
            "float8e4m3" | "fp8e4m3" | "e4m3" => Self::F8E4M3,
            "float8e5m2" | "fp8e5m2" | "e5m2" => Self::F8E5M2,
            _ => return None,
        })
    }

    /// The wire code (stable: it is part of the collective frames and window signatures).
    pub const fn code(self) -> u8 {
        match self {
            Self::I8 => 0,
            Self::U8 => 1,
            Self::I32 => 2,
            Self::U32 => 3,
            Self::I64 => 4,
            Self::U64 => 5,
            Self::F16 => 6,
            Self::F32 => 7,
            Self::F64 => 8,
            Self::Bf16 => 9,
            Self::F8E4M3 => 10,
            Self::F8E5M2 => 11,
        }
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A reduction operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RedOp {
    /// `ncclSum` (integers wrap).
    Sum,
    /// `ncclProd` (integers wrap).
    Prod,
    /// `ncclMin`.
    Min,
    /// `ncclMax`.
    Max,
    /// `ncclAvg`: the sum divided by the rank count (integers: truncating division).
    Avg,
}

impl RedOp {
    /// Every operator.
    pub const ALL: [Self; 5] = [Self::Sum, Self::Prod, Self::Min, Self::Max, Self::Avg];

    /// nccl-tests' name.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Sum => "sum",
            Self::Prod => "prod",
            Self::Min => "min",
            Self::Max => "max",
            Self::Avg => "avg",
        }
    }

    /// Parses a name.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|o| o.name() == s.to_ascii_lowercase())
    }

    /// The operator applied between partial results (avg accumulates as a sum).
    pub(crate) const fn combine(self) -> Self {
        match self {
            Self::Avg => Self::Sum,
            o => o,
        }
    }

    /// The wire code (stable: it is part of the collective frames and window signatures).
    pub const fn code(self) -> u8 {
        match self {
            Self::Sum => 0,
            Self::Prod => 1,
            Self::Min => 2,
            Self::Max => 3,
            Self::Avg => 4,
        }
    }
}

impl fmt::Display for RedOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
