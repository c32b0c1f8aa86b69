// An MLIR program running data-parallel under mpiexec (docs/distributed.md): it
// makes MPI the process group (kina_distributed_init), reads its rank and the
// world size (kina_distributed_rank / _size, i32 through a pointer), fills
// x[i] = (rank + 1) * (i + 1), calls the collective exports the way a
// Kina-compiled module does (llvm.emit_c_interface on unranked memrefs) and
// checks every result against what it computes itself, then finalizes MPI.
// main returns the number of failed checks and prints
// "mlir distributed rank R of N: F failures".
//
// Lowered with mlir-opt-19 / mlir-translate-19 and linked by clang-19 against
// libkina_fx.so, or run under mlir-cpu-runner-19 -shared-libs=libkina_fx.so, each
// under `mpiexec -n 2` and `-n 4` (tests/hosts/mlir/test_mlir_distributed.py).
module {
  func.func private @runtime_all_reduce_f32(memref<*xf32>, memref<*xf32>, i32) -> i32 attributes {llvm.emit_c_interface}
  func.func private @runtime_broadcast_f32(memref<*xf32>, memref<*xf32>, i32) -> i32 attributes {llvm.emit_c_interface}
  // No memref operand: declared without emit_c_interface.
  func.func private @kina_distributed_init(i32) -> i32
  func.func private @kina_distributed_rank(!llvm.ptr) -> i32
  func.func private @kina_distributed_size(!llvm.ptr) -> i32
  func.func private @kina_distributed_finalize() -> i32

  llvm.func @printf(!llvm.ptr, ...) -> i32
  llvm.mlir.global internal constant @fmt_fail("mlir distributed: check %d failed (got %d)\0A\00") {addr_space = 0 : i32}
  llvm.mlir.global internal constant @fmt_done("mlir distributed rank %d of %d: %d failures\0A\00") {addr_space = 0 : i32}

  // 1 (and a printed line) unless got == want.
  func.func @expect(%id: i32, %got: i32, %want: i32) -> i32 {
    %eq = arith.cmpi eq, %got, %want : i32
    %r = scf.if %eq -> i32 {
      %z = arith.constant 0 : i32
      scf.yield %z : i32
    } else {
      %f = llvm.mlir.addressof @fmt_fail : !llvm.ptr
      %p = llvm.call @printf(%f, %id, %got) vararg(!llvm.func<i32 (ptr, ...)>) : (!llvm.ptr, i32, i32) -> i32
      %one = arith.constant 1 : i32
      scf.yield %one : i32
    }
    return %r : i32
  }

  // An i32 answered through a pointer (kina_distributed_rank / _size).
  func.func @query(%which: i32) -> i32 {
    %one = llvm.mlir.constant(1 : i64) : i64
    %cell = llvm.alloca %one x i32 : (i64) -> !llvm.ptr
    %zero = arith.constant 0 : i32
    %is_rank = arith.cmpi eq, %which, %zero : i32
    %status = scf.if %is_rank -> i32 {
      %s = func.call @kina_distributed_rank(%cell) : (!llvm.ptr) -> i32
      scf.yield %s : i32
    } else {
      %s = func.call @kina_distributed_size(%cell) : (!llvm.ptr) -> i32
      scf.yield %s : i32
    }
    %v = llvm.load %cell : !llvm.ptr -> i32
    %ok = arith.cmpi eq, %status, %zero : i32
    %bad = arith.constant -1 : i32
    %r = arith.select %ok, %v, %bad : i32
    return %r : i32
  }

  // m[i] = scale * (i + 1)
  func.func @fill(%m: memref<4xf32>, %scale: f32) {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %c4 = arith.constant 4 : index
    scf.for %i = %c0 to %c4 step %c1 {
      %i1 = arith.addi %i, %c1 : index
      %ii = arith.index_cast %i1 : index to i32
      %if = arith.sitofp %ii : i32 to f32
      %v = arith.mulf %if, %scale : f32
      memref.store %v, %m[%i] : memref<4xf32>
    }
    return
  }

  // The number of elements with m[i] != scale * (i + 1) (the values are exact).
  func.func @mismatches(%m: memref<4xf32>, %scale: f32) -> i32 {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %c4 = arith.constant 4 : index
    %z = arith.constant 0 : i32
    %one = arith.constant 1 : i32
    %n = scf.for %i = %c0 to %c4 step %c1 iter_args(%acc = %z) -> i32 {
      %i1 = arith.addi %i, %c1 : index
      %ii = arith.index_cast %i1 : index to i32
      %if = arith.sitofp %ii : i32 to f32
      %want = arith.mulf %if, %scale : f32
      %got = memref.load %m[%i] : memref<4xf32>
      %eq = arith.cmpf oeq, %got, %want : f32
      %add = arith.select %eq, %z, %one : i32
      %acc2 = arith.addi %acc, %add : i32
      scf.yield %acc2 : i32
    }
    return %n : i32
  }

  // all_reduce with `op` into out; the failures of its status and its values.
  func.func @reduce_check(%id: i32, %out: memref<4xf32>, %ux: memref<*xf32>, %op: i32, %scale: f32) -> i32 {
    %z = arith.constant 0 : i32
    %uout = memref.cast %out : memref<4xf32> to memref<*xf32>
    %s = func.call @runtime_all_reduce_f32(%uout, %ux, %op) : (memref<*xf32>, memref<*xf32>, i32) -> i32
    %f1 = func.call @expect(%id, %s, %z) : (i32, i32, i32) -> i32
    %m = func.call @mismatches(%out, %scale) : (memref<4xf32>, f32) -> i32
    %id2 = arith.addi %id, %id : i32
    %f2 = func.call @expect(%id2, %m, %z) : (i32, i32, i32) -> i32
    %f = arith.addi %f1, %f2 : i32
    return %f : i32
  }

  func.func @main() -> i32 {
    %z = arith.constant 0 : i32
    %one = arith.constant 1 : i32
    %si = func.call @kina_distributed_init(%z) : (i32) -> i32
    %f0 = func.call @expect(%one, %si, %z) : (i32, i32, i32) -> i32
    %rank = func.call @query(%z) : (i32) -> i32
    %size = func.call @query(%one) : (i32) -> i32
    %rank1 = arith.addi %rank, %one : i32
    %rankf = arith.sitofp %rank1 : i32 to f32
    %sizef = arith.sitofp %size : i32 to f32
    // sum over ranks of (r + 1) = size (size + 1) / 2
    %size1 = arith.addi %size, %one : i32
    %tri = arith.muli %size, %size1 : i32
    %trif0 = arith.sitofp %tri : i32 to f32
    %half = arith.constant 0.5 : f32
    %trif = arith.mulf %trif0, %half : f32
    %meanf = arith.divf %trif, %sizef : f32
    %onef = arith.constant 1.0 : f32

    %x = memref.alloc() : memref<4xf32>
    %out = memref.alloc() : memref<4xf32>
    func.call @fill(%x, %rankf) : (memref<4xf32>, f32) -> ()
    %ux = memref.cast %x : memref<4xf32> to memref<*xf32>

    %c10 = arith.constant 10 : i32
    %c11 = arith.constant 11 : i32
    %c12 = arith.constant 12 : i32
    %c13 = arith.constant 13 : i32
    %opsum = arith.constant 0 : i32
    %opmean = arith.constant 1 : i32
    %opmax = arith.constant 2 : i32
    %opmin = arith.constant 3 : i32
    %f1 = func.call @reduce_check(%c10, %out, %ux, %opsum, %trif) : (i32, memref<4xf32>, memref<*xf32>, i32, f32) -> i32
    %f2 = func.call @reduce_check(%c11, %out, %ux, %opmean, %meanf) : (i32, memref<4xf32>, memref<*xf32>, i32, f32) -> i32
    %f3 = func.call @reduce_check(%c12, %out, %ux, %opmax, %sizef) : (i32, memref<4xf32>, memref<*xf32>, i32, f32) -> i32
    %f4 = func.call @reduce_check(%c13, %out, %ux, %opmin, %onef) : (i32, memref<4xf32>, memref<*xf32>, i32, f32) -> i32

    // broadcast from the last rank: (size) * (i + 1) everywhere
    %uout = memref.cast %out : memref<4xf32> to memref<*xf32>
    %last = arith.subi %size, %one : i32
    %sb = func.call @runtime_broadcast_f32(%uout, %ux, %last) : (memref<*xf32>, memref<*xf32>, i32) -> i32
    %c30 = arith.constant 30 : i32
    %f5 = func.call @expect(%c30, %sb, %z) : (i32, i32, i32) -> i32
    %mb = func.call @mismatches(%out, %sizef) : (memref<4xf32>, f32) -> i32
    %c31 = arith.constant 31 : i32
    %f6 = func.call @expect(%c31, %mb, %z) : (i32, i32, i32) -> i32

    // refused alike on every rank: an unknown reduction and a root out of range (status 1)
    %bad = arith.constant 4 : i32
    %s7 = func.call @runtime_all_reduce_f32(%uout, %ux, %bad) : (memref<*xf32>, memref<*xf32>, i32) -> i32
    %c40 = arith.constant 40 : i32
    %f7 = func.call @expect(%c40, %s7, %one) : (i32, i32, i32) -> i32
    %s8 = func.call @runtime_broadcast_f32(%uout, %ux, %size) : (memref<*xf32>, memref<*xf32>, i32) -> i32
    %c41 = arith.constant 41 : i32
    %f8 = func.call @expect(%c41, %s8, %one) : (i32, i32, i32) -> i32

    // in place: x = sum over ranks of x
    %s9 = func.call @runtime_all_reduce_f32(%ux, %ux, %opsum) : (memref<*xf32>, memref<*xf32>, i32) -> i32
    %c50 = arith.constant 50 : i32
    %f9 = func.call @expect(%c50, %s9, %z) : (i32, i32, i32) -> i32
    %m10 = func.call @mismatches(%x, %trif) : (memref<4xf32>, f32) -> i32
    %c51 = arith.constant 51 : i32
    %f10 = func.call @expect(%c51, %m10, %z) : (i32, i32, i32) -> i32

    %t1 = arith.addi %f0, %f1 : i32
    %t2 = arith.addi %t1, %f2 : i32
    %t3 = arith.addi %t2, %f3 : i32
    %t4 = arith.addi %t3, %f4 : i32
    %t5 = arith.addi %t4, %f5 : i32
    %t6 = arith.addi %t5, %f6 : i32
    %t7 = arith.addi %t6, %f7 : i32
    %t8 = arith.addi %t7, %f8 : i32
    %t9 = arith.addi %t8, %f9 : i32
    %failures = arith.addi %t9, %f10 : i32
    %fmt = llvm.mlir.addressof @fmt_done : !llvm.ptr
    %p = llvm.call @printf(%fmt, %rank, %size, %failures) vararg(!llvm.func<i32 (ptr, ...)>) : (!llvm.ptr, i32, i32, i32) -> i32
    memref.dealloc %x : memref<4xf32>
    memref.dealloc %out : memref<4xf32>
    %sf = func.call @kina_distributed_finalize() : () -> i32
    %c60 = arith.constant 60 : i32
    %f11 = func.call @expect(%c60, %sf, %z) : (i32, i32, i32) -> i32
    %all = arith.addi %failures, %f11 : i32
    return %all : i32
  }
}
