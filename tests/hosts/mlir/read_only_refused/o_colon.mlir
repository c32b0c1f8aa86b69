// A quoted function name with a colon.
// (tests/hosts/mlir/test_mlir_read_only.py: no argument it writes may be proven read-only)
module {
  func.func @"a:b"(%a: memref<?xf32>) -> i32 attributes {llvm.emit_c_interface} {
    %ok = arith.constant 0 : i32
    return %ok : i32
  }
  func.func @f(%a: memref<?xf32>, %out: memref<?xf32>) -> i32 attributes {llvm.emit_c_interface} {
    %ok = arith.constant 0 : i32
    return %ok : i32
  }
}
