package org.edgevit.demo

import android.Manifest
import android.content.pm.PackageManager
import android.graphics.Bitmap
import android.graphics.BitmapFactory
import android.graphics.Matrix
import android.media.ExifInterface
import android.net.Uri
import android.os.Bundle
import android.os.SystemClock
import android.util.Log
import android.view.View
import android.widget.AdapterView
import android.widget.ArrayAdapter
import android.widget.Button
import android.widget.ImageView
import android.widget.SeekBar
import android.widget.Spinner
import android.widget.TextView
import androidx.activity.ComponentActivity
import androidx.activity.result.PickVisualMediaRequest
import androidx.activity.result.contract.ActivityResultContracts
import androidx.camera.core.CameraSelector
import androidx.camera.core.ImageAnalysis
import androidx.camera.core.ImageProxy
import androidx.camera.core.Preview
import androidx.camera.core.UseCaseGroup
import androidx.camera.lifecycle.ProcessCameraProvider
import androidx.camera.view.PreviewView
import androidx.core.content.ContextCompat
import org.edgevit.demo.core.Accelerator
import org.edgevit.demo.core.AcceleratorChoice
import org.edgevit.demo.core.FrameRegion
import org.edgevit.demo.core.GpuVerdicts
import org.edgevit.demo.core.MovingAverage
import org.edgevit.demo.core.Pixels
import org.edgevit.demo.core.Placement
import org.edgevit.demo.core.Rotation
import java.util.concurrent.ExecutorService
import java.util.concurrent.Executors

/**
 * The bundled model live on the camera: a classifier's top-5 labels, or a
 * segmenter's category mask over the frame with its legend and an opacity
 * slider (the [VisionTask] the model's metadata asks for); latency as a moving
 * average, accelerator and thread count switchable at run time, and a gallery
 * image as the other input. All model work runs on one background thread
 * ([worker]); the UI thread only shows results.
 */
class MainActivity : ComponentActivity() {
    private lateinit var previewView: PreviewView
    private lateinit var pickedImage: ImageView
    private lateinit var statusText: TextView
    private lateinit var acceleratorWarningText: TextView
    private lateinit var acceleratorInfoText: TextView
    private lateinit var resultsText: TextView
    private lateinit var latencyText: TextView
    private lateinit var delegateSpinner: Spinner
    private lateinit var threadsSpinner: Spinner
    private lateinit var galleryButton: Button
    private lateinit var overlay: ImageView
    private lateinit var resultViews: ResultViews

    private val worker: ExecutorService = Executors.newSingleThreadExecutor()

    // Touched on the worker thread only.
    private var runner: ModelRunner? = null
    private var task: VisionTask? = null
    private val inferenceMs = MovingAverage(LATENCY_WINDOW)
    private val preprocessMs = MovingAverage(LATENCY_WINDOW)
    private val outputMs = MovingAverage(LATENCY_WINDOW)
    private var frameBuffer = IntArray(0)
    private var rotatedBuffer = IntArray(0)

    // Written on the UI thread, read by the analyzer.
    @Volatile private var showingGalleryImage = false

    // UI thread: where the frame-sized overlay lands in its view (see Placement).
    private val overlayMatrix = Matrix()

    private val threadChoices = AcceleratorChoice.threadChoices(Runtime.getRuntime().availableProcessors())
    private var accelerator = Accelerator.CPU
    private var threads = minOf(4, threadChoices.last())

    private val requestCamera = registerForActivityResult(ActivityResultContracts.RequestPermission()) { granted ->
        if (granted) previewView.post { startCamera() } else statusText.setText(R.string.camera_denied)
    }

    private val pickImage = registerForActivityResult(ActivityResultContracts.PickVisualMedia()) { uri ->
        if (uri != null) runOnGalleryImage(uri)
    }

    override fun onCreate(savedInstanceState: Bundle?) {
        super.onCreate(savedInstanceState)
        setContentView(R.layout.activity_main)
        previewView = findViewById(R.id.preview)
        pickedImage = findViewById(R.id.picked_image)
        statusText = findViewById(R.id.status)
        acceleratorWarningText = findViewById(R.id.accelerator_warning)
        acceleratorInfoText = findViewById(R.id.accelerator_info)
        resultsText = findViewById(R.id.results)
        latencyText = findViewById(R.id.latency)
        delegateSpinner = findViewById(R.id.delegate_spinner)
        threadsSpinner = findViewById(R.id.threads_spinner)
        galleryButton = findViewById(R.id.gallery_button)
        overlay = findViewById(R.id.overlay)
        resultViews = ResultViews(resultsText, overlay, findViewById(R.id.overlay_controls))

        if (!ModelRunner.hasModel(assets)) {
            statusText.setText(R.string.no_model)
            galleryButton.isEnabled = false
            return
        }
        setUpControls()
        loadModel()
        if (checkSelfPermission(Manifest.permission.CAMERA) == PackageManager.PERMISSION_GRANTED) {
            previewView.post { startCamera() }
        } else {
            requestCamera.launch(Manifest.permission.CAMERA)
        }
    }

    private fun setUpControls() {
        val accelerators = Accelerator.entries
        delegateSpinner.adapter = ArrayAdapter(this, android.R.layout.simple_spinner_item, accelerators.map { it.label })
            .also { it.setDropDownViewResource(android.R.layout.simple_spinner_dropdown_item) }
        delegateSpinner.setSelection(accelerators.indexOf(accelerator), false)
        delegateSpinner.onItemSelectedListener = onSelected { position ->
            if (accelerators[position] != accelerator) {
                accelerator = accelerators[position]
                loadModel()
            }
        }
        threadsSpinner.adapter = ArrayAdapter(this, android.R.layout.simple_spinner_item, threadChoices.map { it.toString() })
            .also { it.setDropDownViewResource(android.R.layout.simple_spinner_dropdown_item) }
        threadsSpinner.setSelection(threadChoices.indexOf(threads), false)
        threadsSpinner.onItemSelectedListener = onSelected { position ->
            if (threadChoices[position] != threads) {
                threads = threadChoices[position]
                loadModel()
            }
        }
        val opacity = findViewById<SeekBar>(R.id.opacity)
        overlay.alpha = opacity.progress / 100f
        opacity.setOnSeekBarChangeListener(object : SeekBar.OnSeekBarChangeListener {
            override fun onProgressChanged(seekBar: SeekBar?, progress: Int, fromUser: Boolean) {
                overlay.alpha = progress / 100f
            }
            override fun onStartTrackingTouch(seekBar: SeekBar?) {}
            override fun onStopTrackingTouch(seekBar: SeekBar?) {}
        })
        galleryButton.setOnClickListener {
            if (showingGalleryImage) {
                showingGalleryImage = false
                pickedImage.visibility = View.GONE
                overlay.setImageBitmap(null)
                galleryButton.setText(R.string.pick_image)
            } else {
                pickImage.launch(PickVisualMediaRequest(ActivityResultContracts.PickVisualMedia.ImageOnly))
            }
        }
    }

    private fun onSelected(action: (Int) -> Unit) = object : AdapterView.OnItemSelectedListener {
        override fun onItemSelected(parent: AdapterView<*>?, view: View?, position: Int, id: Long) = action(position)
        override fun onNothingSelected(parent: AdapterView<*>?) {}
    }

    /** (Re)open the model with the current accelerator and threads, on the worker thread. */
    private fun loadModel() {
        val requested = accelerator
        val threadCount = threads
        statusText.text = getString(R.string.loading_model, ModelRunner.MODEL_ASSET, requested.label)
        worker.execute {
            runner?.close()
            runner = null
            inferenceMs.clear()
            preprocessMs.clear()
            outputMs.clear()
            var opened: ModelRunner? = null
            val (loaded, loadedTask) = try {
                val model = ModelRunner.create(this, requested, threadCount, gpuVerdicts).also { opened = it }
                // a task reads what it needs beyond the metadata (a raw detector: the anchors in the file) here
                model to VisionTask.forModel(this, model.metadata, model.labels)
            } catch (e: Exception) {
                opened?.close()
                Log.e(TAG, "model load failed", e)
                runOnUiThread { statusText.text = getString(R.string.model_failed, AcceleratorChoice.describe(e)) }
                return@execute
            }
            runner = loaded
            task = loadedTask
            runOnUiThread { loadedTask.attach(resultViews) }
            showWhereItRuns(loaded)
        }
    }

    /** The status line and the accelerator notice for [loaded], from the worker thread. */
    private fun showWhereItRuns(loaded: ModelRunner) {
        val m = loaded.metadata
        val status = getString(
            R.string.running_on, m.model, m.precision, loaded.gpuCheck.active.label, loaded.threads,
            m.inputSize, m.input.type.jsonName,
        )
        val notice = loaded.gpuCheck.notice
        runOnUiThread {
            statusText.text = status
            acceleratorWarningText.showText(notice?.takeIf { it.isWarning }?.text)
            acceleratorInfoText.showText(notice?.takeUnless { it.isWarning }?.text)
        }
    }

    private fun TextView.showText(line: String?) {
        text = line ?: ""
        visibility = if (line != null) View.VISIBLE else View.GONE
    }

    /**
     * Preview and analysis in one group with the preview's viewport: CameraX then gives each frame the crop
     * rect of what the preview shows (the same field of view, whatever the two streams' aspect ratios), which
     * is where the overlay goes ([Placement.fillCenter]). The viewport needs the laid-out view: called posted
     * to it, which runs after its first layout.
     */
    private fun startCamera() {
        val future = ProcessCameraProvider.getInstance(this)
        future.addListener({
            try {
                val provider = future.get()
                val preview = Preview.Builder().build()
                preview.setSurfaceProvider(previewView.surfaceProvider)
                val analysis = ImageAnalysis.Builder()
                    .setBackpressureStrategy(ImageAnalysis.STRATEGY_KEEP_ONLY_LATEST)
                    .setOutputImageFormat(ImageAnalysis.OUTPUT_IMAGE_FORMAT_RGBA_8888)
                    .build()
                analysis.setAnalyzer(worker) { image -> analyze(image) }
                val group = UseCaseGroup.Builder().addUseCase(preview).addUseCase(analysis)
                // No viewport (the view detached meanwhile): each frame's crop rect is the whole frame.
                previewView.viewPort?.let { group.setViewPort(it) }
                provider.unbindAll()
                provider.bindToLifecycle(this, CameraSelector.DEFAULT_BACK_CAMERA, group.build())
            } catch (e: Exception) {
                Log.e(TAG, "camera failed", e)
                statusText.text = getString(R.string.camera_failed, AcceleratorChoice.describe(e))
            }
        }, ContextCompat.getMainExecutor(this))
    }

    /** One camera frame, on the worker thread (KEEP_ONLY_LATEST drops frames while busy). */
    private fun analyze(image: ImageProxy) {
        try {
            val current = runner ?: return
            val currentTask = task ?: return
            if (showingGalleryImage) return
            val bitmap = image.toBitmap()
            val size = bitmap.width * bitmap.height
            if (frameBuffer.size != size) {
                frameBuffer = IntArray(size)
                rotatedBuffer = IntArray(size)
            }
            bitmap.getPixels(frameBuffer, 0, bitmap.width, 0, 0, bitmap.width, bitmap.height)
            val frame = Pixels(frameBuffer, bitmap.width, bitmap.height)
            val degrees = image.imageInfo.rotationDegrees
            // toBitmap() keeps the whole buffer; the crop rect says what of it the preview shows.
            val crop = image.cropRect
            val visible = FrameRegion.upright(crop.left, crop.top, crop.right, crop.bottom, bitmap.width,
                bitmap.height, degrees)
            runAndShow(current, currentTask, Rotation.rotate(frame, degrees, rotatedBuffer), visible)
        } finally {
            image.close()
        }
    }

    private fun runOnGalleryImage(uri: Uri) {
        showingGalleryImage = true
        galleryButton.setText(R.string.back_to_camera)
        overlay.setImageBitmap(null)
        worker.execute {
            val upright = try {
                decodeUpright(uri)
            } catch (e: Exception) {
                Log.e(TAG, "decode failed", e)
                runOnUiThread { statusText.text = getString(R.string.image_failed, AcceleratorChoice.describe(e)) }
                return@execute
            }
            val shown = Bitmap.createBitmap(upright.argb, upright.width, upright.height, Bitmap.Config.ARGB_8888)
            runOnUiThread {
                pickedImage.setImageBitmap(shown)
                pickedImage.visibility = View.VISIBLE
            }
            val current = runner ?: return@execute
            val currentTask = task ?: return@execute
            runAndShow(current, currentTask, upright, visible = null)
        }
    }

    /** Run [image] and show the result; [visible]: what a camera frame's preview shows, null for a gallery image. */
    private fun runAndShow(current: ModelRunner, currentTask: VisionTask, image: Pixels, visible: FrameRegion?) {
        val timing = current.run(image.argb, image.width, image.height)
        val start = SystemClock.elapsedRealtimeNanos()
        val shown = currentTask.interpret(current.outputs(), image)
        val interpretedMs = (SystemClock.elapsedRealtimeNanos() - start) / 1e6
        if (timing.gpuCheckResult != null) {
            showWhereItRuns(current)
        } else {
            // The checking frame stays out of the averages: it was timed on the GPU even when the
            // check moved the model to the CPU.
            inferenceMs.add(timing.inferenceMs)
            preprocessMs.add(timing.preprocessMs)
            outputMs.add(interpretedMs)
        }
        val latency = if (inferenceMs.count == 0) null else {
            getString(R.string.latency, inferenceMs.average, preprocessMs.average, outputMs.average, inferenceMs.count)
        }
        val width = image.width
        val height = image.height
        runOnUiThread {
            shown.show(resultViews)
            placeOverlay(width, height, visible)
            if (latency != null) latencyText.text = latency
        }
    }

    /**
     * The overlay (a [width] x [height] frame's pixels) over what the view shows of the frame: the camera
     * frame's [visible] part filling it as the preview does, or a gallery image fitted whole as [pickedImage] is.
     */
    private fun placeOverlay(width: Int, height: Int, visible: FrameRegion?) {
        if (overlay.width == 0 || overlay.height == 0) return
        val placement = if (visible != null) {
            Placement.fillCenter(visible, overlay.width, overlay.height)
        } else {
            Placement.fitCenter(width, height, overlay.width, overlay.height)
        }
        overlayMatrix.setScale(placement.scale, placement.scale)
        overlayMatrix.postTranslate(placement.dx, placement.dy)
        overlay.imageMatrix = overlayMatrix // ImageView copies it
    }

    /** A gallery image's pixels, downsampled while the shorter side stays >= 1024, EXIF-rotated upright. */
    private fun decodeUpright(uri: Uri): Pixels {
        val bounds = BitmapFactory.Options().apply { inJustDecodeBounds = true }
        contentResolver.openInputStream(uri)?.use { BitmapFactory.decodeStream(it, null, bounds) }
        var sample = 1
        while (minOf(bounds.outWidth, bounds.outHeight) / (sample * 2) >= MAX_GALLERY_SHORT_SIDE) sample *= 2
        val options = BitmapFactory.Options().apply { inSampleSize = sample }
        val bitmap = contentResolver.openInputStream(uri)?.use { BitmapFactory.decodeStream(it, null, options) }
            ?: throw IllegalArgumentException("not an image")
        val orientation = try {
            contentResolver.openInputStream(uri)?.use {
                ExifInterface(it).getAttributeInt(ExifInterface.TAG_ORIENTATION, ExifInterface.ORIENTATION_NORMAL)
            }
        } catch (e: java.io.IOException) {
            null // no readable EXIF: take the pixels as they are
        } ?: ExifInterface.ORIENTATION_NORMAL
        val degrees = when (orientation) {
            ExifInterface.ORIENTATION_ROTATE_90 -> 90
            ExifInterface.ORIENTATION_ROTATE_180 -> 180
            ExifInterface.ORIENTATION_ROTATE_270 -> 270
            else -> 0
        }
        val pixels = IntArray(bitmap.width * bitmap.height)
        bitmap.getPixels(pixels, 0, bitmap.width, 0, 0, bitmap.width, bitmap.height)
        return Rotation.rotate(Pixels(pixels, bitmap.width, bitmap.height), degrees)
    }

    override fun onDestroy() {
        super.onDestroy()
        worker.execute {
            runner?.close()
            runner = null
        }
        worker.shutdown()
    }

    companion object {
        // Outlives the activity, which Android recreates on every screen rotation: each model
        // file's GPU is checked once per process, not once per activity.
        private val gpuVerdicts = GpuVerdicts()

        private const val TAG = "edgevit"
        private const val LATENCY_WINDOW = 20
        private const val MAX_GALLERY_SHORT_SIDE = 1024
    }
}
