// A runtime op declared with a float before its memrefs: the C output is %a.
// (tests/hosts/mlir/test_mlir_read_only.py: no argument it writes may be proven read-only)
module {
  func.func private @runtime_neg_f32(f32, memref<*xf32>, memref<*xf32>) -> i32 attributes {llvm.emit_c_interface}
  func.func @f(%a: memref<?xf32>, %out: memref<?xf32>) -> i32 attributes {llvm.emit_c_interface} {
    %z = arith.constant 0.0 : f32
    %ua = memref.cast %a : memref<?xf32> to memref<*xf32>
    %uo = memref.cast %out : memref<?xf32> to memref<*xf32>
    %s = func.call @runtime_neg_f32(%z, %ua, %uo) : (f32, memref<*xf32>, memref<*xf32>) -> i32
    return %s : i32
  }
}
