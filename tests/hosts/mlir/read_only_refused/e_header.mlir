// A type whose string holds a % in a block header.
// (tests/hosts/mlir/test_mlir_read_only.py: no argument it writes may be proven read-only)
module {
  func.func private @g(%s: !llvm.struct<"%zzz", (i32)>, %a: memref<?xf32>) {
    %c0 = arith.constant 0 : index
    %seven = arith.constant 7.0 : f32
    memref.store %seven, %a[%c0] : memref<?xf32>
    return
  }
  func.func @f(%a: memref<?xf32>, %out: memref<?xf32>) -> i32 attributes {llvm.emit_c_interface} {
    %s = llvm.mlir.undef : !llvm.struct<"%zzz", (i32)>
    func.call @g(%s, %a) : (!llvm.struct<"%zzz", (i32)>, memref<?xf32>) -> ()
    %ok = arith.constant 0 : i32
    return %ok : i32
  }
}
