// The 3D pose view: the model's visible geoms (three.js), posed per world by the server's
// forward kinematics, one tile per world side by side; one orbit camera shared by the
// tiles, each following its world's root body.
import * as THREE from "three";
import { OrbitControls } from "three/addons/OrbitControls.js";

const MUJOCO_UP = new THREE.Vector3(0, 0, 1);

function geometryOf(geom, meshes, blob, extent) {
  const [a, b, c] = geom.size;
  let g;
  switch (geom.type) {
    case "mesh": {
      const m = meshes[geom.mesh];
      if (!m.geometry) {
        const pos = new Float32Array(blob, m.offset, m.vertices * 3);
        const idx = new Uint32Array(blob, m.offset + m.vertices * 12, m.faces * 3);
        m.geometry = new THREE.BufferGeometry();
        m.geometry.setAttribute("position", new THREE.BufferAttribute(pos, 3));
        m.geometry.setIndex(new THREE.BufferAttribute(idx, 1));
        m.geometry.computeVertexNormals();
      }
      return m.geometry;
    }
    case "plane": g = new THREE.PlaneGeometry(2 * (a || extent * 10), 2 * (b || extent * 10)); break;
    case "sphere": g = new THREE.SphereGeometry(a, 24, 16); break;
    case "ellipsoid": g = new THREE.SphereGeometry(1, 24, 16); g.scale(a, b, c); break;
    case "box": g = new THREE.BoxGeometry(2 * a, 2 * b, 2 * c); break;
    case "capsule": g = new THREE.CapsuleGeometry(a, 2 * b, 8, 16); g.rotateX(Math.PI / 2); break;
    case "cylinder": g = new THREE.CylinderGeometry(a, a, 2 * b, 24); g.rotateX(Math.PI / 2); break;
    default: g = new THREE.SphereGeometry(0.01);
  }
  return g;
}

export class PoseView {
  constructor(canvas, labels) {
    this.canvas = canvas;
    this.labels = labels;
    this.renderer = new THREE.WebGLRenderer({ canvas, antialias: false, preserveDrawingBuffer: true });
    this.renderer.setScissorTest(true);
    this.camera = new THREE.PerspectiveCamera(45, 1, 0.001, 1000);
    this.camera.up.copy(MUJOCO_UP);
    this.tileCamera = this.camera.clone();
    this.controls = new OrbitControls(this.camera, canvas);
    this.controls.addEventListener("change", () => this.draw());
    this.tiles = [];
    new ResizeObserver(() => this.draw()).observe(canvas);
  }

  // description: JSON of /api/scene; blob: ArrayBuffer of /api/meshes.
  load(description, blob) {
    this.description = description;
    this.blob = blob;
    const extent = description.extent || 1;
    this.geometries = description.geoms.map((g) => geometryOf(g, description.meshes, blob, extent));
    this.materials = description.geoms.map((g) => new THREE.MeshStandardMaterial({
      color: new THREE.Color(g.rgba[0], g.rgba[1], g.rgba[2]),
      opacity: g.rgba[3], transparent: g.rgba[3] < 1, roughness: 0.7, metalness: 0.0,
      side: g.type === "plane" ? THREE.DoubleSide : THREE.FrontSide,
    }));
    const d = (description.radius || extent) * 1.6;
    this.camera.position.set(d, -d, d * 0.7);
    this.controls.target.set(0, 0, 0);
    this.camera.near = extent / 100; this.camera.far = extent * 100;
    this.controls.update();
  }

  setWorlds(worlds) {
    this.tiles = worlds.map((world) => {
      const scene = new THREE.Scene();
      scene.background = new THREE.Color(0xdfe3ea);
      scene.add(new THREE.HemisphereLight(0xffffff, 0x667788, 2.2));
      const sun = new THREE.DirectionalLight(0xffffff, 1.6);
      sun.position.set(1, -1, 3);
      scene.add(sun);
      const meshes = this.geometries.map((geometry, i) => {
        const m = new THREE.Mesh(geometry, this.materials[i]);
        m.matrixAutoUpdate = false;
        m.visible = false;
        scene.add(m);
        return m;
      });
      return { world, scene, meshes, root: new THREE.Vector3(), posed: false };
    });
    this.labels.replaceChildren(...this.tiles.map((t) => {
      const div = document.createElement("div");
      div.textContent = `world ${t.world}`;
      return div;
    }));
    this.draw();
  }

  // poses: Float32Array (worlds, 1, geoms + 1, 12) for the tiles' worlds, one frame.
  setPoses(poses) {
    const n = this.geometries.length + 1;
    this.tiles.forEach((tile, w) => {
      const base = w * n * 12;
      tile.posed = !Number.isNaN(poses[base]);
      tile.meshes.forEach((mesh, g) => {
        const p = base + g * 12;
        if (Number.isNaN(poses[p])) { mesh.visible = false; return; }
        mesh.visible = true;
        mesh.matrix.set(poses[p + 3], poses[p + 4], poses[p + 5], poses[p],
                        poses[p + 6], poses[p + 7], poses[p + 8], poses[p + 1],
                        poses[p + 9], poses[p + 10], poses[p + 11], poses[p + 2],
                        0, 0, 0, 1);
        mesh.matrixWorldNeedsUpdate = true;
      });
      const r = base + (n - 1) * 12;
      if (!Number.isNaN(poses[r])) tile.root.set(poses[r], poses[r + 1], poses[r + 2]);
    });
    this.draw();
  }

  layout() {
    const n = Math.max(this.tiles.length, 1);
    const cols = Math.ceil(Math.sqrt(n));
    return { cols, rows: Math.ceil(n / cols) };
  }

  draw() {
    const { canvas, renderer } = this;
    const width = canvas.clientWidth, height = canvas.clientHeight;
    if (!width || !height) return;
    if (canvas.width !== width || canvas.height !== height) renderer.setSize(width, height, false);
    renderer.setScissor(0, 0, width, height);
    renderer.setClearColor(0xdfe3ea);
    renderer.clear();
    const { cols, rows } = this.layout();
    const tw = Math.floor(width / cols), th = Math.floor(height / rows);
    const offset = this.camera.position.clone().sub(this.controls.target);
    this.tiles.forEach((tile, i) => {
      const x = (i % cols) * tw, y = height - (Math.floor(i / cols) + 1) * th;
      renderer.setViewport(x, y, tw, th);
      renderer.setScissor(x, y, tw, th);
      const cam = this.tileCamera;
      cam.copy(this.camera);
      cam.aspect = tw / th;
      cam.position.copy(tile.root).add(offset);
      cam.lookAt(tile.root);
      cam.updateProjectionMatrix();
      renderer.render(tile.scene, cam);
      const label = this.labels.children[i];
      if (label) { label.style.left = `${x + 4}px`; label.style.top = `${height - y - th + 4}px`; }
    });
  }
}
