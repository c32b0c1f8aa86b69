// Functions that use their first argument %a in one way each, for
// tests/hosts/mlir/test_mlir_read_only.py: kina_fx.mlir_read_only must prove
// the @r_* ones read-only and must not prove the @w_* ones (which write %a)
// nor the @n_* ones (which only read it, in ways the proof does not follow:
// memref.copy's lowering calls a library function, which the proof does not
// take on trust).
// Each takes (%a, %out), both memref<?xf32> of 4 elements, and returns 0.

#id = affine_map<(i) -> (i)>

module {
  func.func private @runtime_neg_f32(memref<*xf32>, memref<*xf32>) -> i32 attributes {llvm.emit_c_interface}
  func.func private @kina_tape_watch_f32(i64, memref<*xf32>) -> i32 attributes {llvm.emit_c_interface}

  func.func private @reads(%a: memref<?xf32>, %out: memref<?xf32>) {
    %c0 = arith.constant 0 : index
    %v = memref.load %a[%c0] : memref<?xf32>
    memref.store %v, %out[%c0] : memref<?xf32>
    return
  }

  func.func private @writes(%a: memref<?xf32>) {
    %c0 = arith.constant 0 : index
    %seven = arith.constant 7.0 : f32
    memref.store %seven, %a[%c0] : memref<?xf32>
    return
  }

  func.func private @reads_recursively(%a: memref<?xf32>, %out: memref<?xf32>, %n: index) {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %more = arith.cmpi sgt, %n, %c0 : index
    scf.if %more {
      %m = arith.subi %n, %c1 : index
      func.call @reads_recursively(%a, %out, %m) : (memref<?xf32>, memref<?xf32>, index) -> ()
    } else {
      func.call @reads(%a, %out) : (memref<?xf32>, memref<?xf32>) -> ()
    }
    return
  }

  func.func private @kina_reads(%a: memref<?xf32>, %out: memref<?xf32>) {
    func.call @reads(%a, %out) : (memref<?xf32>, memref<?xf32>) -> ()
    return
  }

  // ---- read-only ----
  func.func @r_load(%a: memref<?xf32>, %out: memref<?xf32>) -> i32 attributes {llvm.emit_c_interface} {
    %c0 = arith.constant 0 : index
    %v = memref.load %a[%c0] : memref<?xf32>
    memref.store %v, %out[%c0] : memref<?xf32>
    %ok = arith.constant 0 : i32
    return %ok : i32
  }

  func.func @r_dim(%a: memref<?xf32>, %out: memref<?xf32>) -> i32 attributes {llvm.emit_c_interface} {
    %c0 = arith.constant 0 : index
    %n = memref.dim %a, %c0 : memref<?xf32>
    %i = arith.index_cast %n : index to i32
    %f = arith.sitofp %i : i32 to f32
    memref.store %f, %out[%c0] : memref<?xf32>
    %ok = arith.constant 0 : i32
    return %ok : i32
  }

  func.func @r_runtime_input(%a: memref<?xf32>, %out: memref<?xf32>) -> i32 attributes {llvm.emit_c_interface} {
    %ua = memref.cast %a : memref<?xf32> to memref<*xf32>
    %uo = memref.cast %out : memref<?xf32> to memref<*xf32>
    %s = func.call @runtime_neg_f32(%uo, %ua) : (memref<*xf32>, memref<*xf32>) -> i32
    return %s : i32
  }

  func.func @r_subview_load(%a: memref<?xf32>, %out: memref<?xf32>) -> i32 attributes {llvm.emit_c_interface} {
    %c0 = arith.constant 0 : index
    %sv = memref.subview %a[1] [2] [1] : memref<?xf32> to memref<2xf32, strided<[1], offset: 1>>
    %v = memref.load %sv[%c0] : memref<2xf32, strided<[1], offset: 1>>
    memref.store %v, %out[%c0] : memref<?xf32>
    %ok = arith.constant 0 : i32
    return %ok : i32
  }

  func.func @r_linalg_input(%a: memref<?xf32>, %out: memref<?xf32>) -> i32 attributes {llvm.emit_c_interface} {
    linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel"]}
        ins(%a : memref<?xf32>) outs(%out : memref<?xf32>) {
    ^bb0(%x: f32, %y: f32):
      linalg.yield %x : f32
    }
    %ok = arith.constant 0 : i32
    return %ok : i32
  }

  func.func @n_copy_from(%a: memref<?xf32>, %out: memref<?xf32>) -> i32 attributes {llvm.emit_c_interface} {
    memref.copy %a, %out : memref<?xf32> to memref<?xf32>
    %ok = arith.constant 0 : i32
    return %ok : i32
  }

  func.func @r_call_reads(%a: memref<?xf32>, %out: memref<?xf32>) -> i32 attributes {llvm.emit_c_interface} {
    func.call @reads(%a, %out) : (memref<?xf32>, memref<?xf32>) -> ()
    %ok = arith.constant 0 : i32
    return %ok : i32
  }

  // ---- writes %a ----
  func.func @w_store(%a: memref<?xf32>, %out: memref<?xf32>) -> i32 attributes {llvm.emit_c_interface} {
    %c0 = arith.constant 0 : index
    %seven = arith.constant 7.0 : f32
    memref.store %seven, %a[%c0] : memref<?xf32>
    %ok = arith.constant 0 : i32
    return %ok : i32
  }

  func.func @w_runtime_output(%a: memref<?xf32>, %out: memref<?xf32>) -> i32 attributes {llvm.emit_c_interface} {
    %ua = memref.cast %a : memref<?xf32> to memref<*xf32>
    %uo = memref.cast %out : memref<?xf32> to memref<*xf32>
    %s = func.call @runtime_neg_f32(%ua, %uo) : (memref<*xf32>, memref<*xf32>) -> i32
    return %s : i32
  }

  func.func @w_subview_store(%a: memref<?xf32>, %out: memref<?xf32>) -> i32 attributes {llvm.emit_c_interface} {
    %c0 = arith.constant 0 : index
    %seven = arith.constant 7.0 : f32
    %sv = memref.subview %a[1] [2] [1] : memref<?xf32> to memref<2xf32, strided<[1], offset: 1>>
    memref.store %seven, %sv[%c0] : memref<2xf32, strided<[1], offset: 1>>
    %ok = arith.constant 0 : i32
    return %ok : i32
  }

  func.func @w_fill(%a: memref<?xf32>, %out: memref<?xf32>) -> i32 attributes {llvm.emit_c_interface} {
    %seven = arith.constant 7.0 : f32
    linalg.fill ins(%seven : f32) outs(%a : memref<?xf32>)
    %ok = arith.constant 0 : i32
    return %ok : i32
  }

  func.func @w_linalg_output(%a: memref<?xf32>, %out: memref<?xf32>) -> i32 attributes {llvm.emit_c_interface} {
    linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel"]}
        ins(%out : memref<?xf32>) outs(%a : memref<?xf32>) {
    ^bb0(%x: f32, %y: f32):
      linalg.yield %x : f32
    }
    %ok = arith.constant 0 : i32
    return %ok : i32
  }

  func.func @w_copy_to(%a: memref<?xf32>, %out: memref<?xf32>) -> i32 attributes {llvm.emit_c_interface} {
    memref.copy %out, %a : memref<?xf32> to memref<?xf32>
    %ok = arith.constant 0 : i32
    return %ok : i32
  }

  func.func @w_call_writes(%a: memref<?xf32>, %out: memref<?xf32>) -> i32 attributes {llvm.emit_c_interface} {
    func.call @writes(%a) : (memref<?xf32>) -> ()
    %ok = arith.constant 0 : i32
    return %ok : i32
  }

  func.func @w_reinterpret_store(%a: memref<?xf32>, %out: memref<?xf32>) -> i32 attributes {llvm.emit_c_interface} {
    %c0 = arith.constant 0 : index
    %seven = arith.constant 7.0 : f32
    %r = memref.reinterpret_cast %a to offset: [0], sizes: [1], strides: [1] : memref<?xf32> to memref<1xf32>
    memref.store %seven, %r[%c0] : memref<1xf32>
    %ok = arith.constant 0 : i32
    return %ok : i32
  }

  func.func @w_loop_carried(%a: memref<?xf32>, %out: memref<?xf32>) -> i32 attributes {llvm.emit_c_interface} {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %seven = arith.constant 7.0 : f32
    %last = scf.for %i = %c0 to %c1 step %c1 iter_args(%m = %a) -> (memref<?xf32>) {
      memref.store %seven, %m[%c0] : memref<?xf32>
      scf.yield %m : memref<?xf32>
    }
    %ok = arith.constant 0 : i32
    return %ok : i32
  }

  func.func @w_branch(%a: memref<?xf32>, %out: memref<?xf32>) -> i32 attributes {llvm.emit_c_interface} {
    %c0 = arith.constant 0 : index
    %seven = arith.constant 7.0 : f32
    cf.br ^next(%a : memref<?xf32>)
  ^next(%m: memref<?xf32>):
    memref.store %seven, %m[%c0] : memref<?xf32>
    %ok = arith.constant 0 : i32
    return %ok : i32
  }

  func.func @w_pointer(%a: memref<?xf32>, %out: memref<?xf32>) -> i32 attributes {llvm.emit_c_interface} {
    %seven = arith.constant 7.0 : f32
    %p = memref.extract_aligned_pointer_as_index %a : memref<?xf32> -> index
    %i = arith.index_cast %p : index to i64
    %ptr = llvm.inttoptr %i : i64 to !llvm.ptr
    llvm.store %seven, %ptr : f32, !llvm.ptr
    %ok = arith.constant 0 : i32
    return %ok : i32
  }

  // The view's definition comes after its use in the text (its block dominates the use's).
  func.func @w_view_defined_later(%a: memref<?xf32>, %out: memref<?xf32>) -> i32 attributes {llvm.emit_c_interface} {
    %c0 = arith.constant 0 : index
    %seven = arith.constant 7.0 : f32
    cf.br ^define
  ^use(%v: index):
    memref.store %seven, %sv[%v] : memref<2xf32, strided<[1], offset: 1>>
    %ok = arith.constant 0 : i32
    return %ok : i32
  ^define:
    %sv = memref.subview %a[1] [2] [1] : memref<?xf32> to memref<2xf32, strided<[1], offset: 1>>
    cf.br ^use(%c0 : index)
  }

  // ---- reads %a only, but not in a way the proof follows ----
  func.func @n_recursion(%a: memref<?xf32>, %out: memref<?xf32>) -> i32 attributes {llvm.emit_c_interface} {
    %c2 = arith.constant 2 : index
    func.call @reads_recursively(%a, %out, %c2) : (memref<?xf32>, memref<?xf32>, index) -> ()
    %ok = arith.constant 0 : i32
    return %ok : i32
  }

  func.func @n_library_name(%a: memref<?xf32>, %out: memref<?xf32>) -> i32 attributes {llvm.emit_c_interface} {
    func.call @kina_reads(%a, %out) : (memref<?xf32>, memref<?xf32>) -> ()
    %ok = arith.constant 0 : i32
    return %ok : i32
  }

  func.func private @sine_of_first(%a: memref<?xf32>) -> f32 {
    %c0 = arith.constant 0 : index
    %x = memref.load %a[%c0] : memref<?xf32>
    %s = math.sin %x : f32
    return %s : f32
  }

  // Calls a function with an operation that is not plain (math.sin: a library call).
  func.func @n_unplain_callee(%a: memref<?xf32>, %out: memref<?xf32>) -> i32 attributes {llvm.emit_c_interface} {
    %c0 = arith.constant 0 : index
    %s = func.call @sine_of_first(%a) : (memref<?xf32>) -> f32
    memref.store %s, %out[%c0] : memref<?xf32>
    %ok = arith.constant 0 : i32
    return %ok : i32
  }

  // Another library's function (with no tape behind handle 0 it fails, reading nothing).
  func.func @n_external_call(%a: memref<?xf32>, %out: memref<?xf32>) -> i32 attributes {llvm.emit_c_interface} {
    %none = arith.constant 0 : i64
    %ua = memref.cast %a : memref<?xf32> to memref<*xf32>
    %s = func.call @kina_tape_watch_f32(%none, %ua) : (i64, memref<*xf32>) -> i32
    %ok = arith.constant 0 : i32
    return %ok : i32
  }

  func.func @n_returned(%a: memref<?xf32>, %out: memref<?xf32>) -> i32 attributes {llvm.emit_c_interface} {
    %yes = arith.constant true
    %m = scf.if %yes -> memref<?xf32> {
      scf.yield %a : memref<?xf32>
    } else {
      scf.yield %out : memref<?xf32>
    }
    %ok = arith.constant 0 : i32
    return %ok : i32
  }
}
