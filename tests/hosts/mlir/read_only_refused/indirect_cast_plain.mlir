// indirect_cast.mlir without its passthrough attributes: the indirect call in a function f runs is no plain operation.
// (tests/hosts/mlir/test_mlir_read_only.py: no argument it writes may be proven read-only)
module {
  memref.global @sink : memref<1xf32> = dense<0.0>
  memref.global @fptr : memref<1xi64> = dense<0>
  // writes through its second parameter; never called with an argument of f
  func.func @h(%p: !llvm.ptr, %q: !llvm.ptr) {
    %v = arith.constant 42.0 : f32
    llvm.store %v, %q : f32, !llvm.ptr
    return
  }
  // only reads %a, then calls h as () -> () through a pointer kept in @fptr:
  // h's %q is what the second register still holds, %a's aligned pointer
  func.func @g(%a: memref<?xf32>) -> f32 {
    %c0 = arith.constant 0 : index
    %x = memref.load %a[%c0] : memref<?xf32>
    %k = memref.get_global @fptr : memref<1xi64>
    %i = memref.load %k[%c0] : memref<1xi64>
    %p = llvm.inttoptr %i : i64 to !llvm.ptr
    %fq = builtin.unrealized_conversion_cast %p : !llvm.ptr to () -> ()
    func.call_indirect %fq() : () -> ()
    return %x : f32
  }
  func.func @f(%a: memref<?xf32>) -> i32 attributes {llvm.emit_c_interface} {
    %c0 = arith.constant 0 : index
    %fp = func.constant @h : (!llvm.ptr, !llvm.ptr) -> ()
    %pp = builtin.unrealized_conversion_cast %fp : (!llvm.ptr, !llvm.ptr) -> () to !llvm.ptr
    %pi = llvm.ptrtoint %pp : !llvm.ptr to i64
    %k = memref.get_global @fptr : memref<1xi64>
    memref.store %pi, %k[%c0] : memref<1xi64>
    %s = func.call @g(%a) : (memref<?xf32>) -> f32
    %sk = memref.get_global @sink : memref<1xf32>
    memref.store %s, %sk[%c0] : memref<1xf32>
    %z = arith.constant 0 : i32
    return %z : i32
  }
}
