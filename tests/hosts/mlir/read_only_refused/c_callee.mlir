// A quoted callee, and a string attribute that spells another callee.
// (tests/hosts/mlir/test_mlir_read_only.py: no argument it writes may be proven read-only)
module {
  func.func private @reads(%a: memref<?xf32>) {
    %c0 = arith.constant 0 : index
    %v = memref.load %a[%c0] : memref<?xf32>
    return
  }
  func.func private @"w x"(%a: memref<?xf32>) {
    %c0 = arith.constant 0 : index
    %seven = arith.constant 7.0 : f32
    memref.store %seven, %a[%c0] : memref<?xf32>
    return
  }
  func.func @f(%a: memref<?xf32>, %out: memref<?xf32>) -> i32 attributes {llvm.emit_c_interface} {
    func.call @"w x"(%a) {note = "callee = @reads"} : (memref<?xf32>) -> ()
    %ok = arith.constant 0 : i32
    return %ok : i32
  }
}
