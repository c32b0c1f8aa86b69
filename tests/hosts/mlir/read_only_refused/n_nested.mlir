// A nested module with a function of the same name.
// (tests/hosts/mlir/test_mlir_read_only.py: no argument it writes may be proven read-only)
module {
  func.func @g(%a: memref<?xf32>, %out: memref<?xf32>) -> i32 attributes {llvm.emit_c_interface} {
    %c0 = arith.constant 0 : index
    %seven = arith.constant 7.0 : f32
    memref.store %seven, %a[%c0] : memref<?xf32>
    %ok = arith.constant 0 : i32
    return %ok : i32
  }
  module @inner {
    func.func @g(%a: memref<?xf32>, %out: memref<?xf32>) -> i32 attributes {llvm.emit_c_interface} {
      %ok = arith.constant 0 : i32
      return %ok : i32
    }
  }
}
