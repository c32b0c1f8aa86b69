// A C interface that returns a memref: a result pointer comes first.
// (tests/hosts/mlir/test_mlir_read_only.py: no argument it writes may be proven read-only)
module {
  func.func @f(%w: memref<?xf32>, %r: memref<?xf32>) -> memref<?xf32> attributes {llvm.emit_c_interface} {
    %c0 = arith.constant 0 : index
    %seven = arith.constant 7.0 : f32
    memref.store %seven, %w[%c0] : memref<?xf32>
    %v = memref.load %r[%c0] : memref<?xf32>
    return %w : memref<?xf32>
  }
}
