// A string attribute holding }) and llvm.emit_c_interface.
// (tests/hosts/mlir/test_mlir_read_only.py: no argument it writes may be proven read-only)
module {
  func.func @f(%a: memref<?xf32>, %out: memref<?xf32>) attributes {llvm.emit_c_interface} {
    %c0 = arith.constant 0 : index
    %seven = arith.constant 7.0 : f32
    memref.store %seven, %a[%c0] {note = "}) llvm.emit_c_interface"} : memref<?xf32>
    return
  }
}
